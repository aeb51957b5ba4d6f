/*
 * settings.c - process-wide settings (SPEC 10). Environment variables are read once, at the
 * first use of any setting; setters override them afterwards.
 *   DG_NUM_THREADS  threads kernels use (default: logical cores available to the process)
 *   DG_BACKEND      "reference" forces the scalar reference implementations
 *   DG_ISA          see cpu.c
 */
#include "../core/internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* DeepGEMM's legacy (and default) row alignment for contiguous grouped layouts. */
#define DG_DEFAULT_MK_ALIGNMENT 128

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static atomic_int g_num_sms;
static atomic_int g_backend;
static atomic_int g_tc_util = 100;
static atomic_int g_pdl;
static atomic_int g_ignore_compile_dims;
static atomic_int g_block_m_multiple = 1, g_block_n_multiple = 1;
static atomic_int g_mk_alignment = DG_DEFAULT_MK_ALIGNMENT;

static void init_from_env(void) {
    int n = dg_cpu()->logical_cores;
    const char *s = getenv("DG_NUM_THREADS");
    if (s && *s) {
        char *end;
        const long v = strtol(s, &end, 10);
        if (*end == '\0' && v > 0 && v <= 4096)
            n = (int)v;
    }
    atomic_store(&g_num_sms, n);
    s = getenv("DG_BACKEND");
    atomic_store(&g_backend, (s && strcmp(s, "reference") == 0) ? DG_BACKEND_REFERENCE : DG_BACKEND_AUTO);
}

static void ensure_init(void) { pthread_once(&g_once, init_from_env); }

dg_status dg_set_num_sms(int num_sms) {
    ensure_init();
    dg_api_begin("dg_set_num_sms");
    DG_CHECK(num_sms > 0 && num_sms <= 4096, DG_ERR_VALUE, "argument 'num_sms' must be in [1, 4096], got %d", num_sms);
    atomic_store(&g_num_sms, num_sms);
    return DG_OK;
}

int dg_get_num_sms(void) {
    ensure_init();
    return atomic_load(&g_num_sms);
}

int dg_num_threads(void) { return dg_get_num_sms(); }

dg_backend dg_get_backend(void) {
    ensure_init();
    return (dg_backend)atomic_load(&g_backend);
}

dg_status dg_set_backend(dg_backend backend) {
    ensure_init();
    dg_api_begin("dg_set_backend");
    DG_CHECK(backend == DG_BACKEND_AUTO || backend == DG_BACKEND_REFERENCE, DG_ERR_VALUE,
             "argument 'backend' is an unknown backend %d", (int)backend);
    atomic_store(&g_backend, (int)backend);
    return DG_OK;
}

bool dg_use_reference(void) { return dg_get_backend() == DG_BACKEND_REFERENCE; }

dg_status dg_set_tc_util(int tc_util) {
    dg_api_begin("dg_set_tc_util");
    DG_CHECK(tc_util > 0 && tc_util <= 100, DG_ERR_VALUE, "argument 'tc_util' must be in [1, 100], got %d", tc_util);
    atomic_store(&g_tc_util, tc_util);
    return DG_OK;
}

int dg_get_tc_util(void) { return atomic_load(&g_tc_util); }
void dg_set_pdl(int enable_pdl) { atomic_store(&g_pdl, enable_pdl != 0); }
int dg_get_pdl(void) { return atomic_load(&g_pdl); }
void dg_set_ignore_compile_dims(int ignore) { atomic_store(&g_ignore_compile_dims, ignore != 0); }
int dg_get_ignore_compile_dims(void) { return atomic_load(&g_ignore_compile_dims); }

/* No kernel has a non-deterministic variant, so there is nothing for the flag to switch. */
void dg_use_deterministic_algorithms(int enabled) { (void)enabled; }
int dg_get_deterministic_algorithms(void) { return 1; }

dg_status dg_set_block_size_multiple_of(int block_m_multiple_of, int block_n_multiple_of) {
    dg_api_begin("dg_set_block_size_multiple_of");
    DG_CHECK(block_m_multiple_of > 0 && block_n_multiple_of > 0, DG_ERR_VALUE,
             "arguments 'block_m_multiple_of' and 'block_n_multiple_of' must be positive, got (%d, %d)",
             block_m_multiple_of, block_n_multiple_of);
    atomic_store(&g_block_m_multiple, block_m_multiple_of);
    atomic_store(&g_block_n_multiple, block_n_multiple_of);
    return DG_OK;
}

void dg_get_block_size_multiple_of(int *block_m_multiple_of, int *block_n_multiple_of) {
    if (block_m_multiple_of)
        *block_m_multiple_of = atomic_load(&g_block_m_multiple);
    if (block_n_multiple_of)
        *block_n_multiple_of = atomic_load(&g_block_n_multiple);
}

dg_status dg_set_mk_alignment_for_contiguous_layout(int alignment) {
    dg_api_begin("dg_set_mk_alignment_for_contiguous_layout");
    DG_CHECK(alignment > 0 && alignment <= (1 << 20), DG_ERR_VALUE,
             "argument 'alignment' must be in [1, 2^20], got %d", alignment);
    atomic_store(&g_mk_alignment, alignment);
    return DG_OK;
}

int dg_get_mk_alignment_for_contiguous_layout(void) { return atomic_load(&g_mk_alignment); }

int dg_get_theoretical_mk_alignment_for_contiguous_layout(int expected_m) {
    /* The CPU kernels handle any group start: row blocks never cross a group boundary, so one
     * row of alignment is enough whatever expected_m is. */
    (void)expected_m;
    return 1;
}

dg_gemm_options dg_gemm_options_default(void) {
    dg_gemm_options o;
    memset(&o, 0, sizeof o);
    o.ensure_zero_padding = 1;
    return o;
}
