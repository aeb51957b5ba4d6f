/* alloc.c - aligned temporary buffers for kernels and reference code. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* 64 bytes: one cache line and one AVX-512 register. */
#define DG_ALIGNMENT 64

void *dg_malloc(size_t bytes) {
    if (bytes == 0)
        bytes = 1;
    if (bytes > SIZE_MAX - DG_ALIGNMENT)
        return NULL;
    const size_t rounded = (bytes + DG_ALIGNMENT - 1) / DG_ALIGNMENT * DG_ALIGNMENT;
    return aligned_alloc(DG_ALIGNMENT, rounded);
}

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
