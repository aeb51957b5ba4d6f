/*
 * workspace.c - reusable memory for packed panels. A GEMM packs up to a few hundred MiB of
 * panels per call; fresh allocations would be zeroed by the kernel page by page on first
 * touch (measured: ~20% of a 4096 x 2112 x 7168 BF16 GEMM). A small process-wide pool keeps
 * released blocks for the next call. Blocks are huge-page aligned and advised (fewer TLB
 * misses on the panel streams). The pool holds at most DG_WS_SLOTS blocks (a large GEMM takes
 * three: A's panels, B's and its tile buffers; six let two run at once); a call finding every
 * slot busy (more concurrent GEMMs) allocates privately. Memory stays with the process.
 */
#include "engine.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>

#define DG_WS_SLOTS 6
#define DG_WS_HUGE ((size_t)2 << 20)

typedef struct ws_slot {
    void *ptr;
    size_t cap;
    int busy;
} ws_slot;

static ws_slot g_slots[DG_WS_SLOTS];
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static void *big_alloc(size_t bytes, size_t *cap) {
    if (bytes < 2 * DG_WS_HUGE) {
        *cap = bytes;
        return dg_malloc(bytes);
    }
    *cap = (bytes + DG_WS_HUGE - 1) / DG_WS_HUGE * DG_WS_HUGE;
    void *p = dg_aligned_alloc(DG_WS_HUGE, *cap);
#ifdef MADV_HUGEPAGE
    if (p)
        madvise(p, *cap, MADV_HUGEPAGE);
#endif
    return p;
}

void *dg_ws_get(size_t bytes) {
    if (bytes == 0) /* an empty free slot "fits" 0 bytes but has no block */
        bytes = 1;
    pthread_mutex_lock(&g_mu);
    int best = -1;
    for (int i = 0; i < DG_WS_SLOTS; ++i) { /* the smallest free block that fits, else any free one */
        if (g_slots[i].busy)
            continue;
        if (best < 0)
            best = i;
        const int fits = g_slots[i].cap >= bytes, best_fits = g_slots[best].cap >= bytes;
        if ((fits && (!best_fits || g_slots[i].cap < g_slots[best].cap)) ||
            (!fits && !best_fits && g_slots[i].cap > g_slots[best].cap))
            best = i;
    }
    void *p = NULL;
    if (best >= 0) {
        ws_slot *s = &g_slots[best];
        if (s->cap < bytes) {
            free(s->ptr);
            s->ptr = big_alloc(bytes, &s->cap);
            if (!s->ptr)
                s->cap = 0;
        }
        if (s->ptr)
            s->busy = 1, p = s->ptr;
    }
    pthread_mutex_unlock(&g_mu);
    if (!p && best < 0) { /* every slot busy: a block outside the pool (a slot that failed to grow is out of memory) */
        size_t cap;
        p = big_alloc(bytes, &cap);
    }
    return p;
}

void dg_ws_put(void *p) {
    if (!p)
        return;
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < DG_WS_SLOTS; ++i)
        if (g_slots[i].ptr == p && g_slots[i].busy) {
            g_slots[i].busy = 0;
            pthread_mutex_unlock(&g_mu);
            return;
        }
    pthread_mutex_unlock(&g_mu);
    free(p);
}

void dg_ws_release_idle(void) {
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < DG_WS_SLOTS; ++i)
        if (!g_slots[i].busy) {
            free(g_slots[i].ptr);
            g_slots[i].ptr = NULL;
            g_slots[i].cap = 0;
        }
    pthread_mutex_unlock(&g_mu);
}
