/*
 * symm_buffer.h - the mega MoE symmetric buffer (include/deepgemm.h, section mega-moe): one
 * POSIX shared-memory segment per rank, of the same layout on every rank, mapped by all ranks
 * of the machine, plus the barrier the fused calls synchronise with.
 *
 * Segment layout (offsets from the configuration alone, so every rank computes the same):
 *   header        one page: identity, configuration, the owner's pid, the arrival counter and
 *                 the two posting slots (status, token count, message) of the barrier
 *   x             [T, H] E4M3 codes (BF16 for bf16xbf16, [T, H/2] E2M1 pairs for fp4xfp4)
 *   x_sf          [T, ceil(H/128)] INT32 packed UE8M0 ([T, H/64] packed E4M3 for fp4xfp4,
 *                 [T, H/128] FLOAT32 for the SM90 buffer; none for bf16xbf16)
 *   topk_idx      [T, K] INT64
 *   topk_weights  [T, K] FLOAT32
 *   combine       [T, K, H] BF16: row (t, j) is written by the rank owning topk_idx[t, j]
 * with T = num_max_tokens_per_rank. Every area starts on a 4 KiB boundary.
 *
 * Barrier protocol. Call n of a buffer posts value 2n-1 ("inputs ready", phase A) and 2n
 * ("expert outputs written", phase B) into the rank's own `arrive`, after writing the posting
 * slot value % 2 (its status and, in phase A, its token count). A rank waits until every
 * peer's `arrive` reached the value, then reads their slots. Slot parity makes this safe: a
 * rank cannot post value v + 2 before every peer posted v + 1, which they do only after
 * reading the slots of v. A peer's x, topk and combine area are only touched between phase A
 * and phase B of the same call, and the owner reads its combine area after phase B and writes
 * its inputs (the user does) after the call returns, i.e. before it posts the next phase A.
 */
#ifndef DG_COMM_SYMM_BUFFER_H
#define DG_COMM_SYMM_BUFFER_H

#include "core/internal.h"

#include <stdatomic.h>

#define DG_SYMM_MSG_BYTES 240

typedef struct dg_symm_post {
    int32_t status;         /* DG_OK, or the rank's own failure */
    int32_t pad;
    int64_t num_tokens;     /* phase A: T_r of this call */
    char msg[DG_SYMM_MSG_BYTES];
} dg_symm_post;

typedef struct dg_symm_header {
    uint64_t magic;
    uint32_t version, header_bytes;
    int64_t segment_bytes;
    int32_t rank, num_ranks, pid, mma;
    int64_t num_experts, num_max_tokens, num_topk, hidden, inter, num_shared;
    char name[72];
    _Atomic uint64_t arrive; /* the last barrier value this rank posted */
    dg_symm_post post[2];
} dg_symm_header;

/* Byte offsets of the areas and the segment size; false when sizes overflow. */
typedef struct dg_symm_layout {
    int64_t x, x_sf, topk_idx, topk_weights, combine, bytes;
    int64_t x_row;        /* bytes of a token row: H (E4M3), 2H (BF16) or H / 2 (E2M1 pairs) */
    int64_t sf_cols;      /* 4-byte scale words per token: ceil(H / 128) (INT32, UE8M0 per 32), H / 64
                           * (fp4xfp4: E4M3 per 16), H / 128 (SM90: FLOAT32 per 128), 0 for bf16xbf16 */
} dg_symm_layout;

struct dg_symm_buffer {
    dg_mega_moe_config cfg;  /* num_max_tokens_per_rank aligned */
    dg_symm_layout lay;
    char name[72];
    char *local;             /* this rank's segment (== peer[rank]) */
    char **peer;             /* [R] mapped segments, NULL before attach */
    int attached, sealed, named;
    int broken;              /* a barrier failed: the ranks' counters disagree forever */
    uint64_t calls;          /* fused calls started on this rank */
    double timeout;          /* seconds (DG_COMM_TIMEOUT) */
    /* Network path (src/comm/mpi.c): peer[r] of every other rank is a private mirror that MPI
     * fills with the parts of r's areas this rank reads (topk, routed x rows) and whose
     * combine rows MPI returns to r; synchronisation is MPI's too. NULL: shared memory. */
    void *net;
};

/* Checks a configuration (rank included when check_rank) and aligns its token count. */
dg_status dg_symm_check_config(const dg_mega_moe_config *in, int check_rank, dg_mega_moe_config *out);
bool dg_symm_compute_layout(const dg_mega_moe_config *cfg, dg_symm_layout *lay);

static inline dg_symm_header *dg_symm_hdr(const dg_symm_buffer *b, int r) {
    return (dg_symm_header *)b->peer[r];
}

/*
 * Posts `value` with this rank's status (and token count, phase A) and waits for every peer to
 * post it. DG_OK when every rank posted DG_OK; DG_ERR_VALUE naming the first rank that posted
 * a failure (its message quoted; the buffer stays usable); DG_ERR_COMM when a peer exited or
 * the timeout passed (the buffer is marked broken).
 */
dg_status dg_symm_barrier(dg_symm_buffer *b, uint64_t value, dg_status mine, const char *my_msg,
                          int64_t num_tokens);

/*
 * The network path's steps of a call (src/comm/mpi.c; without MPI they are never reached):
 * the barrier, filling the mirrors after a successful phase A (every rank's topk, then the x
 * rows routed to this rank's experts), and returning the combine rows written into the mirrors
 * to their source ranks (called on every rank after phase A succeeded, even when this rank's
 * expert work failed, so that no rank waits in a collective alone).
 */
dg_status dg_symm_net_barrier(dg_symm_buffer *b, uint64_t value, dg_status mine, const char *my_msg,
                              int64_t num_tokens, int64_t *tokens_out);
dg_status dg_symm_net_dispatch(dg_symm_buffer *b, const int64_t *tokens);
dg_status dg_symm_net_combine(dg_symm_buffer *b, const int64_t *tokens);
void dg_symm_net_free(dg_symm_buffer *b);

/* A peer's area pointers. */
static inline char *dg_symm_area(const dg_symm_buffer *b, int r, int64_t offset) { return b->peer[r] + offset; }

#endif /* DG_COMM_SYMM_BUFFER_H */
