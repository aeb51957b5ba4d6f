/*
 * dginfo - what deepgemm-cpu sees on this machine: version, CPU, instruction-set features,
 * the ISA level kernels will use, thread count and backend, and which path serves each kernel
 * family here (one small call per case, reported by the library's path report; see
 * dg_set_print_paths). Uses only the public header.
 *
 * Exit status: 0, or 1 when the CPU could not be queried or a probe call failed.
 */
#include <deepgemm.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *yes_no(int v) { return v ? "yes" : "no"; }

/* A zero-filled tensor of its own memory; scale tensors get `fill` (a bit pattern) instead. */
static dg_tensor make(dg_dtype dt, int64_t d0, int64_t d1, uint32_t fill) {
    const size_t es = dg_dtype_size(dt), n = (size_t)(d0 * d1) * es;
    void *p = calloc(n ? n : 1, 1);
    if (fill)
        for (size_t i = 0; i < n / 4; ++i)
            memcpy((char *)p + 4 * i, &fill, 4);
    return dg_tensor_2d(p, dt, d0, d1);
}

#define ONE_F32 0x3fc00000u  /* 1.5f: float32 scales that are not powers of two */
#define ONE_UE8M0 0x7f7f7f7fu /* four packed UE8M0 scales of 1.0 */

/* One call per family and M class; returns the number of failed calls. */
static int probe(void) {
    const int64_t n = 128, k = 512, ms[3] = {1, 48, 512};
    int failed = 0;
    dg_gemm_options fp4o = dg_gemm_options_default();
    fp4o.recipe_a[0] = 1, fp4o.recipe_a[1] = 128, fp4o.recipe_b[0] = 1, fp4o.recipe_b[1] = 32;
    dg_gemm_options f44o = fp4o;
    f44o.recipe_a[1] = 32;
    dg_tensor b16 = make(DG_BFLOAT16, n, k, 0), b8 = make(DG_FLOAT8_E4M3, n, k, 0);
    dg_tensor sfb8 = make(DG_FLOAT32, 1, k / 128, ONE_F32), b4 = make(DG_FP4_E2M1X2, n, k / 2, 0);
    dg_tensor sfb4 = make(DG_INT32, n, k / 128, ONE_UE8M0);
    for (int i = 0; i < 3; ++i) {
        const int64_t m = ms[i];
        dg_tensor a16 = make(DG_BFLOAT16, m, k, 0), a8 = make(DG_FLOAT8_E4M3, m, k, 0);
        dg_tensor sfa8 = make(DG_FLOAT32, m, k / 128, ONE_F32), sfa8p = make(DG_INT32, m, k / 512, ONE_UE8M0);
        dg_tensor a4 = make(DG_FP4_E2M1X2, m, k / 2, 0), sfa4 = make(DG_INT32, m, k / 128, ONE_UE8M0);
        dg_tensor d = make(DG_BFLOAT16, m, n, 0);
        failed += dg_bf16_gemm_nt(&a16, &b16, &d, NULL) != DG_OK;
        failed += dg_fp8_gemm_nt(&a8, &sfa8, &b8, &sfb8, &d, NULL, NULL) != DG_OK;
        failed += dg_fp8_fp4_gemm_nt(&a8, &sfa8p, &b4, &sfb4, &d, NULL, &fp4o) != DG_OK;
        failed += dg_fp8_fp4_gemm_nt(&a4, &sfa4, &b4, &sfb4, &d, NULL, &f44o) != DG_OK;
        void *bufs[] = {a16.data, a8.data, sfa8.data, sfa8p.data, a4.data, sfa4.data, d.data};
        for (size_t j = 0; j < sizeof bufs / sizeof bufs[0]; ++j)
            free(bufs[j]);
    }
    /* HC prenorm, MQA logits, a per-token cast */
    dg_tensor ha = make(DG_BFLOAT16, 16, k, 0), hb = make(DG_FLOAT32, 24, k, 0), hd = make(DG_FLOAT32, 16, 24, 0);
    int64_t s16 = 16;
    dg_tensor hs = dg_tensor_make(calloc(16, 4), DG_FLOAT32, 1, &s16);
    failed += dg_tf32_hc_prenorm_gemm(&ha, &hb, &hd, &hs, 0) != DG_OK;
    int64_t qs[3] = {4, 8, 64};
    dg_tensor q = dg_tensor_make(calloc(4 * 8 * 64, 1), DG_FLOAT8_E4M3, 3, qs), kv = make(DG_FLOAT8_E4M3, 64, 64, 0);
    int64_t s64 = 64, s4 = 4;
    dg_tensor kvsf = dg_tensor_make(calloc(64, 4), DG_FLOAT32, 1, &s64), w = make(DG_FLOAT32, 4, 8, 0);
    dg_tensor ks = dg_tensor_make(calloc(4, 4), DG_INT32, 1, &s4), ke = dg_tensor_make(calloc(4, 4), DG_INT32, 1, &s4);
    dg_tensor logits = make(DG_FLOAT32, 4, 64, 0);
    failed += dg_fp8_mqa_logits(&q, &kv, &kvsf, &w, &ks, &ke, 1, 0, &logits) != DG_OK;
    dg_tensor x = make(DG_BFLOAT16, 16, k, 0), xo = make(DG_FLOAT8_E4M3, 16, k, 0), xs = make(DG_FLOAT32, 16, k / 128, 0);
    failed += dg_per_token_cast_to_fp8(&x, 0, 128, 0, &xo, &xs) != DG_OK;
    dg_tensor *all[] = {&b16, &b8, &sfb8, &b4, &sfb4, &ha, &hb, &hd, &hs, &q, &kv, &kvsf, &w, &ks, &ke, &logits,
                        &x, &xo, &xs};
    for (size_t j = 0; j < sizeof all / sizeof all[0]; ++j)
        free(all[j]->data);
    return failed;
}

int main(void) {
    dg_cpu_info ci;
    if (dg_get_cpu_info(&ci) != DG_OK) {
        fprintf(stderr, "dginfo: %s\n", dg_last_error());
        return 1;
    }
    printf("deepgemm-cpu   %s\n", dg_version_string());
    printf("cpu vendor     %s\n", ci.vendor[0] ? ci.vendor : "(unknown)");
    printf("cpu brand      %s\n", ci.brand[0] ? ci.brand : "(unknown)");
    printf("logical cores  %d\n", ci.logical_cores);
    printf("features       avx2=%s fma=%s avx512f=%s avx512bw=%s avx512vl=%s\n", yes_no(ci.avx2),
           yes_no(ci.fma), yes_no(ci.avx512f), yes_no(ci.avx512bw), yes_no(ci.avx512vl));
    printf("               avx512_bf16=%s avx512_vnni=%s amx_bf16=%s amx_int8=%s (tiles granted: %s)\n",
           yes_no(ci.avx512_bf16), yes_no(ci.avx512_vnni), yes_no(ci.amx_bf16), yes_no(ci.amx_int8),
           yes_no(ci.amx_usable));
    printf("caches         L1d %lld KiB, L2 %lld KiB, L3 %lld KiB per core (0: unknown)\n",
           (long long)(ci.cache_bytes[1] >> 10), (long long)(ci.cache_bytes[2] >> 10), (long long)(ci.cache_bytes[3] >> 10));
    printf("best isa       %s\n", dg_isa_name(ci.best_isa));
    printf("selected isa   %s   (DG_ISA)\n", dg_isa_name(dg_get_isa()));
    printf("num_sms        %d   (threads; DG_NUM_THREADS)\n", dg_get_num_sms());
    printf("backend        %s   (DG_BACKEND)\n",
           dg_get_backend() == DG_BACKEND_REFERENCE ? "reference" : "auto");

    /* The path report of small probe calls: what serves each family at M = 1, 48 and 512. */
    const int mode = dg_get_print_paths();
    dg_set_print_paths(2);
    dg_clear_path_report();
    const int failed = probe();
    const size_t need = dg_get_path_report(NULL, 0) + 1;
    char *report = malloc(need);
    dg_get_path_report(report, need);
    printf("paths          (probe calls at M = 1, 48, 512; DG_PRINT_PATHS=1 reports a program's own)\n");
    for (char *line = strtok(report, "\n"); line; line = strtok(NULL, "\n"))
        printf("  %s\n", line);
    free(report);
    dg_clear_path_report();
    dg_set_print_paths(mode);
    if (failed)
        fprintf(stderr, "dginfo: %d probe calls failed\n", failed);
    return failed ? 1 : 0;
}
