/* alloc.c - aligned temporary buffers for kernels and reference code. */
#include "internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* 64 bytes: one cache line and one AVX-512 register. */
#define DG_ALIGNMENT 64

/*
 * Fault injection for tests/test_alloc_failure.c: the allocations still to go before the one
 * that fails (0: off). Counted with one atomic decrement so that allocations from OpenMP
 * threads count too; which thread's allocation is the Nth one is then up to the schedule,
 * which the test allows for (every outcome must be a clean DG_ERR_ALLOC or a correct result).
 */
static atomic_long g_fail_countdown;

void dg_alloc_fail_nth(long n) { atomic_store(&g_fail_countdown, n > 0 ? n : 0); }

bool dg_alloc_fail_pending(void) { return atomic_load(&g_fail_countdown) > 0; }

static bool injected_failure(void) {
    long left = atomic_load_explicit(&g_fail_countdown, memory_order_relaxed);
    while (left > 0)
        if (atomic_compare_exchange_weak(&g_fail_countdown, &left, left - 1))
            return left == 1;
    return false;
}

void *dg_aligned_alloc(size_t align, size_t bytes) {
    if (bytes == 0)
        bytes = 1;
    if (bytes > SIZE_MAX - align || injected_failure())
        return NULL;
    return aligned_alloc(align, (bytes + align - 1) / align * align);
}

void *dg_malloc(size_t bytes) { return dg_aligned_alloc(DG_ALIGNMENT, bytes); }

void *dg_calloc(size_t count, size_t size) {
    size_t bytes;
    if (__builtin_mul_overflow(count, size, &bytes))
        return NULL;
    void *p = dg_malloc(bytes);
    if (p)
        memset(p, 0, bytes);
    return p;
}

void dg_free(void *p) { free(p); }
