/*
 * mpi.c - the symmetric buffer over an MPI communicator (dg_symm_buffer_create_mpi) and the
 * network path of the fused calls.
 *
 * Ranks that all share one machine (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) holds them all)
 * get the shared-memory buffer of symm_buffer.c, MPI serving only as the bootstrap. Otherwise,
 * or with DG_COMM_FORCE_NETWORK=1, every exchange goes through MPI (one code path, whatever
 * the mix of local and remote peers): each rank keeps private mirrors of its peers' segments,
 *   dispatch  every rank's topk_idx / topk_weights by MPI_Allgatherv, then each source rank
 *             sends every destination the x rows (and scales) of its tokens routed to the
 *             destination's experts, in token order, by MPI_Alltoallv into the mirrors;
 *   experts   run unchanged on the mirrors (src/engine/mega_moe.c), writing expert outputs
 *             into the mirrors' combine areas;
 *   combine   each rank returns those rows to their source ranks by MPI_Alltoallv, in
 *             (token, slot) order, and the source sums them as on the shared-memory path,
 * so y is bitwise the same on both paths. Barriers are MPI_Allgather of the posting slots.
 * A rank that dies is MPI's to handle (Open MPI and MPICH abort the job; no call hangs), so
 * DG_COMM_TIMEOUT does not apply here. The exchanges are blocking: overlapping them with the
 * expert waves is future work.
 */
#define _GNU_SOURCE
#include "symm_buffer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef DG_HAVE_MPI
#include <mpi.h>

#include <limits.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

typedef struct net_state {
    MPI_Comm comm;
} net_state;

int dg_has_mpi(void) { return 1; }

const char *dg_mpi_library_version(void) {
    static char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    if (!version[0])
        MPI_Get_library_version(version, &len); /* callable before MPI_Init */
    return version;
}

static MPI_Comm comm_of(const dg_symm_buffer *b) { return ((const net_state *)b->net)->comm; }

/* Every rank's status; on failure, the first failing rank's message, on every rank. */
static dg_status agree(MPI_Comm comm, dg_status mine, const char *what) {
    int R, me;
    MPI_Comm_size(comm, &R);
    MPI_Comm_rank(comm, &me);
    char msg[DG_SYMM_MSG_BYTES] = {0};
    if (mine != DG_OK)
        snprintf(msg, sizeof msg, "%s", dg_last_error());
    int *all = calloc((size_t)R, sizeof *all);
    char *msgs = calloc((size_t)R, DG_SYMM_MSG_BYTES);
    if (!all || !msgs) {
        free(all), free(msgs);
        MPI_Abort(comm, 1); /* the peers are inside the collective: no clean way out */
        return DG_ERR_ALLOC;
    }
    int m = (int)mine;
    MPI_Allgather(&m, 1, MPI_INT, all, 1, MPI_INT, comm);
    MPI_Allgather(msg, DG_SYMM_MSG_BYTES, MPI_CHAR, msgs, DG_SYMM_MSG_BYTES, MPI_CHAR, comm);
    dg_status st = DG_OK;
    for (int r = 0; r < R && st == DG_OK; ++r)
        if (all[r] != DG_OK) {
            if (r == me)
                st = mine;
            else
                st = dg_fail((dg_status)all[r], "rank %d failed in %s: %.*s", r, what, DG_SYMM_MSG_BYTES,
                             msgs + (size_t)r * DG_SYMM_MSG_BYTES);
        }
    free(all), free(msgs);
    return st;
}

static void *anon(int64_t bytes) {
    void *p = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static int force_network(void) {
    const char *s = getenv("DG_COMM_FORCE_NETWORK");
    return s && *s && strcmp(s, "0") != 0;
}

/* The network path's buffer: private segment and mirrors, a duplicated communicator. */
static dg_status create_net(MPI_Comm comm, const dg_mega_moe_config *c, dg_symm_buffer **out) {
    dg_symm_buffer *b = dg_calloc(1, sizeof *b);
    char **peer = dg_calloc((size_t)c->num_ranks, sizeof *peer);
    net_state *ns = dg_calloc(1, sizeof *ns);
    if (!b || !peer || !ns) {
        dg_free(b), dg_free(peer), dg_free(ns);
        return dg_fail(DG_ERR_ALLOC, "cannot allocate the symmetric buffer's descriptor");
    }
    b->cfg = *c;
    dg_symm_compute_layout(c, &b->lay);
    b->peer = peer;
    b->net = ns;
    MPI_Comm_dup(comm, &ns->comm);
    for (int r = 0; r < c->num_ranks; ++r) {
        peer[r] = anon(b->lay.bytes); /* untouched pages cost nothing */
        if (!peer[r]) {
            dg_symm_buffer_destroy(b);
            return dg_fail(DG_ERR_ALLOC, "cannot map %lld bytes for rank %d's mirror", (long long)b->lay.bytes, r);
        }
    }
    b->local = peer[c->rank];
    b->attached = b->sealed = 1;
    *out = b;
    return DG_OK;
}

void dg_symm_net_free(dg_symm_buffer *b) {
    net_state *ns = b->net;
    if (!ns)
        return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized)
        MPI_Comm_free(&ns->comm);
    dg_free(ns);
    b->net = NULL;
}

dg_status dg_symm_buffer_create_mpi(const void *mpi_comm, const dg_mega_moe_config *cfg, dg_symm_buffer **out) {
    dg_api_begin("dg_symm_buffer_create_mpi");
    DG_CHECK(mpi_comm != NULL && cfg != NULL && out != NULL, DG_ERR_NULL_POINTER,
             "arguments 'mpi_comm', 'cfg' and 'out' must not be NULL");
    *out = NULL;
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    DG_CHECK(inited && !finalized, DG_ERR_VALUE, "MPI is not initialized (call MPI_Init first) or already finalized");
    MPI_Comm comm = *(const MPI_Comm *)mpi_comm;
    DG_CHECK(comm != MPI_COMM_NULL, DG_ERR_VALUE, "argument 'mpi_comm' is MPI_COMM_NULL");
    dg_mega_moe_config c = *cfg;
    MPI_Comm_size(comm, &c.num_ranks);
    MPI_Comm_rank(comm, &c.rank);

    /* Local checks first, agreed on by all ranks, then the same configuration everywhere. */
    dg_mega_moe_config aligned = {0};
    dg_symm_layout lay;
    dg_status st = dg_symm_check_config(&c, 1, &aligned);
    if (st == DG_OK && !dg_symm_compute_layout(&aligned, &lay))
        st = dg_fail(DG_ERR_OVERFLOW, "the symmetric buffer for this configuration exceeds 2^40 bytes per rank");
    DG_TRY(agree(comm, st, "its configuration"));
    int64_t mine[8] = {aligned.num_experts, aligned.num_max_tokens_per_rank, aligned.num_topk, aligned.hidden,
                       aligned.intermediate_hidden, aligned.num_shared_experts, (int64_t)aligned.mma, 0};
    int64_t root[8];
    memcpy(root, mine, sizeof root);
    MPI_Bcast(root, 8, MPI_INT64_T, 0, comm);
    st = memcmp(root, mine, sizeof root) == 0
             ? DG_OK
             : dg_fail(DG_ERR_VALUE, "the ranks passed different configurations: rank 0 has (num_experts, "
                                     "tokens, topk, hidden, intermediate, shared, mma) = (%lld, %lld, %lld, %lld, "
                                     "%lld, %lld, %lld), rank %d (%lld, %lld, %lld, %lld, %lld, %lld, %lld)",
                       (long long)root[0], (long long)root[1], (long long)root[2], (long long)root[3],
                       (long long)root[4], (long long)root[5], (long long)root[6], c.rank, (long long)mine[0],
                       (long long)mine[1], (long long)mine[2], (long long)mine[3], (long long)mine[4],
                       (long long)mine[5], (long long)mine[6]);
    DG_TRY(agree(comm, st, "the configuration check"));

    MPI_Comm node;
    int node_size = 0;
    MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, c.rank, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &node_size);
    MPI_Comm_free(&node);
    int local_all = node_size == c.num_ranks, all_local = 0;
    MPI_Allreduce(&local_all, &all_local, 1, MPI_INT, MPI_LAND, comm);
    int net = !all_local || force_network(), any_net = 0;
    MPI_Allreduce(&net, &any_net, 1, MPI_INT, MPI_LOR, comm); /* one path for all ranks */
    if (any_net) {
        st = create_net(comm, &aligned, out);
        DG_TRY(agree(comm, st, "creating its buffer"));
        return DG_OK;
    }

    /* Shared memory, with MPI as the bootstrap: rank 0 names the buffer. */
    char name[65] = {0};
    if (c.rank == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        snprintf(name, sizeof name, "mpi.%d.%lx.%lx", (int)getpid(), (unsigned long)ts.tv_sec,
                 (unsigned long)ts.tv_nsec ^ (unsigned long)rand());
    }
    MPI_Bcast(name, sizeof name, MPI_CHAR, 0, comm);
    dg_symm_buffer *b = NULL;
    st = dg_symm_buffer_create(&c, name, &b);
    dg_api_begin("dg_symm_buffer_create_mpi");
    st = agree(comm, st, "dg_symm_buffer_create");
    if (st == DG_OK) {
        st = dg_symm_buffer_attach(b);
        dg_api_begin("dg_symm_buffer_create_mpi");
        st = agree(comm, st, "dg_symm_buffer_attach");
    }
    if (st == DG_OK) {
        MPI_Barrier(comm); /* every rank mapped every peer: the names can go */
        st = dg_symm_buffer_seal(b);
        dg_api_begin("dg_symm_buffer_create_mpi");
    }
    if (st != DG_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", dg_last_error());
        dg_symm_buffer_destroy(b);
        dg_api_begin("dg_symm_buffer_create_mpi");
        return dg_fail(st, "%s", msg);
    }
    *out = b;
    return DG_OK;
}

dg_status dg_symm_net_barrier(dg_symm_buffer *b, uint64_t value, dg_status mine, const char *my_msg,
                              int64_t num_tokens, int64_t *tokens_out) {
    const int R = b->cfg.num_ranks, me = b->cfg.rank;
    dg_symm_post post = {.status = (int32_t)mine, .num_tokens = num_tokens};
    snprintf(post.msg, sizeof post.msg, "%s", my_msg ? my_msg : "");
    dg_symm_post *all = dg_malloc((size_t)R * sizeof *all);
    if (!all) {
        MPI_Abort(comm_of(b), 1);
        return DG_ERR_ALLOC;
    }
    MPI_Allgather(&post, (int)sizeof post, MPI_BYTE, all, (int)sizeof post, MPI_BYTE, comm_of(b));
    dg_status st = DG_OK;
    for (int r = 0; r < R; ++r) {
        if (tokens_out)
            tokens_out[r] = all[r].num_tokens;
        if (st == DG_OK && all[r].status != DG_OK)
            st = r == me ? (dg_status)all[r].status
                         : dg_fail(DG_ERR_VALUE, "rank %d failed this call (%s): %.*s", r,
                                   dg_status_string((dg_status)all[r].status), DG_SYMM_MSG_BYTES, all[r].msg);
    }
    (void)value;
    dg_free(all);
    return st;
}

/* Does token t of rank s route a slot to rank d's experts? */
static int routes_to(const dg_symm_buffer *b, int s, int64_t t, int d) {
    const int64_t K = b->cfg.num_topk, epr = b->cfg.num_experts / b->cfg.num_ranks;
    const int64_t *idx = (const int64_t *)dg_symm_area(b, s, b->lay.topk_idx) + t * K;
    for (int64_t j = 0; j < K; ++j)
        if (idx[j] >= d * epr && idx[j] < (d + 1) * epr)
            return 1;
    return 0;
}

static int fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

/* Allgatherv of one per-token area (bytes_per_token each) into every mirror. */
static dg_status gather_area(dg_symm_buffer *b, const int64_t *tokens, int64_t offset, int64_t bytes_per_token,
                             int *counts, int *displs, char *stage) {
    const int R = b->cfg.num_ranks;
    int64_t total = 0;
    for (int r = 0; r < R; ++r) {
        const int64_t n = tokens[r] * bytes_per_token;
        DG_CHECK(fits_int(n) && fits_int(total + n), DG_ERR_OVERFLOW,
                 "network path: one exchange of %lld bytes exceeds MPI's int counts", (long long)(total + n));
        counts[r] = (int)n, displs[r] = (int)total;
        total += n;
    }
    MPI_Allgatherv(b->local + offset, counts[b->cfg.rank], MPI_BYTE, stage, counts, displs, MPI_BYTE, comm_of(b));
    for (int r = 0; r < R; ++r)
        if (r != b->cfg.rank)
            memcpy(b->peer[r] + offset, stage + displs[r], (size_t)counts[r]);
    return DG_OK;
}

dg_status dg_symm_net_dispatch(dg_symm_buffer *b, const int64_t *tokens) {
    const int R = b->cfg.num_ranks, me = b->cfg.rank;
    const int64_t K = b->cfg.num_topk, xrow = b->lay.x_row, sfrow = b->lay.sf_cols * 4;
    const int64_t row = xrow + sfrow;
    int64_t all_tokens = 0, mine_out = 0, in_total = 0;
    for (int r = 0; r < R; ++r)
        all_tokens += tokens[r];
    int *cnt = dg_calloc((size_t)R * 4, sizeof *cnt);
    char *stage = dg_malloc((size_t)(all_tokens * K * 8 + 64));
    dg_status st = DG_OK;
    if (!cnt || !stage) {
        st = dg_fail(DG_ERR_ALLOC, "network path: cannot allocate the exchange buffers");
        MPI_Abort(comm_of(b), 1);
        goto done;
    }
    int *sc = cnt, *sd = cnt + R, *rc = cnt + 2 * R, *rd = cnt + 3 * R;
    if ((st = gather_area(b, tokens, b->lay.topk_idx, K * 8, rc, rd, stage)) != DG_OK ||
        (st = gather_area(b, tokens, b->lay.topk_weights, K * 4, rc, rd, stage)) != DG_OK)
        goto done;
    dg_free(stage);
    stage = NULL;

    /* Rows this rank sends to d: its tokens routed to d's experts, in token order. */
    for (int d = 0; d < R; ++d) {
        int64_t n = 0, m = 0;
        for (int64_t t = 0; t < tokens[me]; ++t)
            n += d != me && routes_to(b, me, t, d);
        for (int64_t t = 0; t < tokens[d]; ++t)
            m += d != me && routes_to(b, d, t, me);
        if (!fits_int((mine_out + n) * row) || !fits_int((in_total + m) * row)) {
            st = dg_fail(DG_ERR_OVERFLOW, "network path: the dispatch exceeds MPI's int counts");
            goto done;
        }
        sc[d] = (int)(n * row), sd[d] = (int)(mine_out * row), mine_out += n;
        rc[d] = (int)(m * row), rd[d] = (int)(in_total * row), in_total += m;
    }
    char *out = dg_malloc((size_t)(mine_out * row + 64)), *in = dg_malloc((size_t)(in_total * row + 64));
    if (!out || !in) {
        dg_free(out), dg_free(in);
        st = dg_fail(DG_ERR_ALLOC, "network path: cannot allocate the dispatch buffers");
        MPI_Abort(comm_of(b), 1);
        goto done;
    }
    for (int d = 0; d < R; ++d) {
        char *p = out + sd[d];
        for (int64_t t = 0; t < tokens[me] && d != me; ++t)
            if (routes_to(b, me, t, d)) {
                memcpy(p, b->local + b->lay.x + t * xrow, (size_t)xrow);
                memcpy(p + xrow, b->local + b->lay.x_sf + t * sfrow, (size_t)sfrow);
                p += row;
            }
    }
    MPI_Alltoallv(out, sc, sd, MPI_BYTE, in, rc, rd, MPI_BYTE, comm_of(b));
    for (int s = 0; s < R; ++s) {
        const char *p = in + rd[s];
        for (int64_t t = 0; t < tokens[s] && s != me; ++t)
            if (routes_to(b, s, t, me)) {
                memcpy(b->peer[s] + b->lay.x + t * xrow, p, (size_t)xrow);
                memcpy(b->peer[s] + b->lay.x_sf + t * sfrow, p + xrow, (size_t)sfrow);
                p += row;
            }
    }
    dg_free(out), dg_free(in);
done:
    dg_free(cnt);
    dg_free(stage);
    return st;
}

dg_status dg_symm_net_combine(dg_symm_buffer *b, const int64_t *tokens) {
    const int R = b->cfg.num_ranks, me = b->cfg.rank;
    const int64_t K = b->cfg.num_topk, H = b->cfg.hidden, epr = b->cfg.num_experts / R, row = H * 2;
    int *cnt = dg_calloc((size_t)R * 4, sizeof *cnt);
    if (!cnt) {
        MPI_Abort(comm_of(b), 1);
        return DG_ERR_ALLOC;
    }
    int *sc = cnt, *sd = cnt + R, *rc = cnt + 2 * R, *rd = cnt + 3 * R;
    int64_t out_n = 0, in_n = 0;
    /* To source s: the rows of s's pairs routed to this rank's experts; from owner d: this rank's
     * pairs routed to d's experts. Both in (token, slot) order. */
    for (int r = 0; r < R; ++r) {
        int64_t n = 0, m = 0;
        const int64_t *is = (const int64_t *)dg_symm_area(b, r, b->lay.topk_idx);
        const int64_t *im = (const int64_t *)dg_symm_area(b, me, b->lay.topk_idx);
        for (int64_t i = 0; i < tokens[r] * K && r != me; ++i)
            n += is[i] >= me * epr && is[i] < (me + 1) * epr;
        for (int64_t i = 0; i < tokens[me] * K && r != me; ++i)
            m += im[i] >= r * epr && im[i] < (r + 1) * epr;
        if (!fits_int((out_n + n) * row) || !fits_int((in_n + m) * row)) {
            dg_free(cnt);
            return dg_fail(DG_ERR_OVERFLOW, "network path: the combine exceeds MPI's int counts");
        }
        sc[r] = (int)(n * row), sd[r] = (int)(out_n * row), out_n += n;
        rc[r] = (int)(m * row), rd[r] = (int)(in_n * row), in_n += m;
    }
    char *out = dg_malloc((size_t)(out_n * row + 64)), *in = dg_malloc((size_t)(in_n * row + 64));
    if (!out || !in) {
        dg_free(out), dg_free(in), dg_free(cnt);
        MPI_Abort(comm_of(b), 1);
        return DG_ERR_ALLOC;
    }
    for (int s = 0; s < R; ++s) {
        char *p = out + sd[s];
        const int64_t *is = (const int64_t *)dg_symm_area(b, s, b->lay.topk_idx);
        for (int64_t i = 0; i < tokens[s] * K && s != me; ++i)
            if (is[i] >= me * epr && is[i] < (me + 1) * epr) {
                memcpy(p, b->peer[s] + b->lay.combine + i * row, (size_t)row);
                p += row;
            }
    }
    MPI_Alltoallv(out, sc, sd, MPI_BYTE, in, rc, rd, MPI_BYTE, comm_of(b));
    const int64_t *im = (const int64_t *)dg_symm_area(b, me, b->lay.topk_idx);
    for (int d = 0; d < R; ++d) {
        const char *p = in + rd[d];
        for (int64_t i = 0; i < tokens[me] * K && d != me; ++i)
            if (im[i] >= d * epr && im[i] < (d + 1) * epr) {
                memcpy(b->local + b->lay.combine + i * row, p, (size_t)row);
                p += row;
            }
    }
    dg_free(out), dg_free(in), dg_free(cnt);
    return DG_OK;
}

#else /* no MPI in this build */

int dg_has_mpi(void) { return 0; }

const char *dg_mpi_library_version(void) { return ""; }

dg_status dg_symm_buffer_create_mpi(const void *mpi_comm, const dg_mega_moe_config *cfg, dg_symm_buffer **out) {
    dg_api_begin("dg_symm_buffer_create_mpi");
    if (out)
        *out = NULL;
    return dg_fail(DG_ERR_UNSUPPORTED, "this build of the library has no MPI (configure with MPI installed, "
                                       "or -DDG_MPI=ON); use dg_symm_buffer_create with your own bootstrap");
}

dg_status dg_symm_net_barrier(dg_symm_buffer *b, uint64_t value, dg_status mine, const char *my_msg,
                              int64_t num_tokens, int64_t *tokens_out) {
    return dg_fail(DG_ERR_INTERNAL, "network path without MPI");
}
dg_status dg_symm_net_dispatch(dg_symm_buffer *b, const int64_t *tokens) {
    return dg_fail(DG_ERR_INTERNAL, "network path without MPI");
}
dg_status dg_symm_net_combine(dg_symm_buffer *b, const int64_t *tokens) {
    return dg_fail(DG_ERR_INTERNAL, "network path without MPI");
}
void dg_symm_net_free(dg_symm_buffer *b) { (void)b; }

#endif
