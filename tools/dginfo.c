/*
 * dginfo - what deepgemm-cpu sees on this machine: version, CPU, instruction-set features,
 * the ISA level kernels will use, thread count and backend. Uses only the public header.
 *
 * Exit status: 0, or 1 when the CPU could not be queried.
 */
#include <deepgemm.h>

#include <stdio.h>

static const char *yes_no(int v) { return v ? "yes" : "no"; }

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
    printf("best isa       %s\n", dg_isa_name(ci.best_isa));
    printf("selected isa   %s   (DG_ISA)\n", dg_isa_name(dg_get_isa()));
    printf("num_sms        %d   (threads; DG_NUM_THREADS)\n", dg_get_num_sms());
    printf("backend        %s   (DG_BACKEND)\n",
           dg_get_backend() == DG_BACKEND_REFERENCE ? "reference" : "auto");
    return 0;
}
