/*
 * barrier.c - the barrier of the mega MoE calls over the ranks' shared segments (protocol in
 * symm_buffer.h). Waiting spins briefly, then yields and sleeps, because ranks usually
 * outnumber idle cores (two ranks of two threads on a two-core machine): a pure spin would
 * steal the core the late rank needs. While waiting it checks that late peers still exist, so
 * a rank that died fails the others at once instead of after DG_COMM_TIMEOUT.
 */
#define _GNU_SOURCE
#include "symm_buffer.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <sched.h>

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* False when the process is gone or a zombie (exited, not yet reaped by its parent). */
static bool process_alive(int pid) {
    if (pid <= 0)
        return true; /* unknown: rely on the timeout */
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return false;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return true; /* no procfs, or another PID namespace: the timeout decides */
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *close_paren = strrchr(buf, ')'); /* "pid (comm) S ..." */
    return !(close_paren && close_paren[1] == ' ' && (close_paren[2] == 'Z' || close_paren[2] == 'X'));
}

static void pause_briefly(unsigned spins) {
    if (spins < 64) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    } else if (spins < 256) {
        sched_yield();
    } else {
        const struct timespec ts = {0, spins < 4096 ? 20000 : 200000}; /* 20 us, then 0.2 ms */
        nanosleep(&ts, NULL);
    }
}

dg_status dg_symm_barrier(dg_symm_buffer *b, uint64_t value, dg_status mine, const char *my_msg,
                          int64_t num_tokens) {
    const int R = b->cfg.num_ranks, me = b->cfg.rank;
    dg_symm_header *self = dg_symm_hdr(b, me);
    dg_symm_post *post = &self->post[value % 2];
    post->status = (int32_t)mine;
    post->num_tokens = num_tokens;
    snprintf(post->msg, sizeof post->msg, "%s", my_msg ? my_msg : "");
    atomic_store_explicit(&self->arrive, value, memory_order_release);

    const double deadline = now_seconds() + b->timeout;
    for (int r = 0; r < R; ++r) {
        dg_symm_header *h = dg_symm_hdr(b, r);
        unsigned spins = 0;
        while (atomic_load_explicit(&h->arrive, memory_order_acquire) < value) {
            pause_briefly(spins++);
            if ((spins & 255) != 0)
                continue;
            /* A dead peer may have posted `value` after the load above and then, this being its
             * last barrier, returned and exited: once it is seen dead its post can no longer
             * change, so read it again (seen in CI: a descheduled rank failed the second of two
             * calls that its peers had finished). */
            if (!process_alive(h->pid)) {
                if (atomic_load_explicit(&h->arrive, memory_order_acquire) >= value)
                    break;
                b->broken = 1;
                return dg_fail(DG_ERR_COMM, "rank %d (pid %d) exited before reaching the call's %s barrier",
                               r, h->pid, value % 2 ? "dispatch" : "combine");
            }
            if (now_seconds() > deadline) {
                if (atomic_load_explicit(&h->arrive, memory_order_acquire) >= value)
                    break; /* arrived while this rank was descheduled */
                b->broken = 1;
                return dg_fail(DG_ERR_COMM,
                               "rank %d (pid %d) did not reach the call's %s barrier within DG_COMM_TIMEOUT = "
                               "%g s (did every rank make the same sequence of mega MoE calls?)",
                               r, h->pid, value % 2 ? "dispatch" : "combine", b->timeout);
            }
        }
    }
    for (int r = 0; r < R; ++r) {
        const dg_symm_post *p = &dg_symm_hdr(b, r)->post[value % 2];
        if (p->status != DG_OK) {
            if (r == me)
                return (dg_status)p->status; /* the caller's own failure, already recorded */
            return dg_fail(p->status == DG_ERR_COMM ? DG_ERR_COMM : DG_ERR_VALUE,
                           "rank %d failed this call (%s): %.*s", r, dg_status_string((dg_status)p->status),
                           DG_SYMM_MSG_BYTES, p->msg);
        }
    }
    return DG_OK;
}
