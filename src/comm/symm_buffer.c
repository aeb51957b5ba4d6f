/*
 * symm_buffer.c - creating, attaching and tearing down the mega MoE symmetric buffer over POSIX
 * shared memory (layout and protocol in symm_buffer.h), and the entry points of deepgemm.h that
 * describe it. The fused calls are in src/api/mega_moe_fused.c.
 */
#define _GNU_SOURCE
#include "symm_buffer.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define SYMM_MAGIC 0x4447434d4f45ull /* "DGCMOE" */
#define SYMM_VERSION 1u
#define SYMM_PAGE 4096
/* Token counts are rounded up to this so that areas of consecutive tokens stay aligned. */
#define SYMM_TOKEN_ALIGNMENT 8
/* No configuration needs more per rank; larger ones are typos that would exhaust /dev/shm. */
#define SYMM_MAX_SEGMENT ((int64_t)1 << 40)

/* DeepGEMM's SM90 kernel aligns its token counts to its 128-row M blocks; the SM90 buffer's
 * views keep that shape. */
#define SYMM_SM90_TOKEN_ALIGNMENT 128

int64_t dg_get_token_alignment_for_mega_moe(void) { return SYMM_TOKEN_ALIGNMENT; }
int64_t dg_get_token_alignment_for_sm90_mega_moe(void) { return SYMM_SM90_TOKEN_ALIGNMENT; }

dg_status dg_symm_check_config(const dg_mega_moe_config *in, int check_rank, dg_mega_moe_config *out) {
    DG_CHECK(in != NULL, DG_ERR_NULL_POINTER, "argument 'cfg' is NULL");
    DG_CHECK(in->num_ranks >= 1 && in->num_ranks <= 4096, DG_ERR_VALUE,
             "num_ranks must be in [1, 4096], got %d", in->num_ranks);
    DG_CHECK(!check_rank || (in->rank >= 0 && in->rank < in->num_ranks), DG_ERR_VALUE,
             "rank must be in [0, num_ranks = %d), got %d", in->num_ranks, in->rank);
    DG_CHECK(in->mma == DG_MEGA_MOE_FP8XFP4 || in->mma == DG_MEGA_MOE_BF16XBF16 || in->mma == DG_MEGA_MOE_FP8XFP8 ||
                 in->mma == DG_MEGA_MOE_FP4XFP4 || in->mma == DG_MEGA_MOE_SM90_FP8,
             DG_ERR_VALUE,
             "mma must be DG_MEGA_MOE_FP8XFP4, DG_MEGA_MOE_BF16XBF16, DG_MEGA_MOE_FP8XFP8, DG_MEGA_MOE_FP4XFP4 or "
             "DG_MEGA_MOE_SM90_FP8, got %d",
             (int)in->mma);
    DG_CHECK(in->num_experts > 0 && in->num_experts <= (1 << 20) && in->num_experts % in->num_ranks == 0,
             DG_ERR_VALUE, "num_experts must be a positive multiple of num_ranks (%d) up to 2^20, got %lld",
             in->num_ranks, (long long)in->num_experts);
    DG_CHECK(in->num_topk >= 1 && in->num_topk <= in->num_experts, DG_ERR_VALUE,
             "num_topk must be in [1, num_experts = %lld], got %lld", (long long)in->num_experts,
             (long long)in->num_topk);
    DG_CHECK(in->num_max_tokens_per_rank >= 0 && in->num_max_tokens_per_rank <= ((int64_t)1 << 30),
             DG_ERR_VALUE, "num_max_tokens_per_rank must be in [0, 2^30], got %lld",
             (long long)in->num_max_tokens_per_rank);
    DG_CHECK(in->hidden > 0 && in->hidden <= (1 << 20) && in->intermediate_hidden > 0 &&
                 in->intermediate_hidden <= (1 << 20),
             DG_ERR_VALUE, "hidden and intermediate_hidden must be in [1, 2^20], got %lld and %lld",
             (long long)in->hidden, (long long)in->intermediate_hidden);
    DG_CHECK(in->mma != DG_MEGA_MOE_FP8XFP4 || (in->hidden % 2 == 0 && in->intermediate_hidden % 2 == 0),
             DG_ERR_VALUE, "fp8xfp4 needs even hidden and intermediate_hidden (packed FP4 weights), got %lld and %lld",
             (long long)in->hidden, (long long)in->intermediate_hidden);
    /* NVFP4: tokens, activations and weights carry one E4M3 scale per 16 values, four to an INT32
     * word (DeepGEMM's layout), so both widths are whole words of scales. */
    DG_CHECK(in->mma != DG_MEGA_MOE_FP4XFP4 || (in->hidden % 64 == 0 && in->intermediate_hidden % 64 == 0),
             DG_ERR_VALUE, "fp4xfp4 needs hidden and intermediate_hidden multiples of 64 (NVFP4 scales per 16 "
             "values, four per INT32), got %lld and %lld",
             (long long)in->hidden, (long long)in->intermediate_hidden);
    /* SM90: whole 128x128 weight scale blocks in both layers, 64-wide activation scale groups;
     * DeepGEMM also asks 256 | hidden (its combine's vector width) and has no shared experts. */
    DG_CHECK(in->mma != DG_MEGA_MOE_SM90_FP8 || (in->hidden % 256 == 0 && in->intermediate_hidden % 128 == 0),
             DG_ERR_VALUE, "the SM90 FP8 mega MoE needs hidden a multiple of 256 and intermediate_hidden a multiple "
             "of 128, got %lld and %lld", (long long)in->hidden, (long long)in->intermediate_hidden);
    DG_CHECK(in->mma != DG_MEGA_MOE_SM90_FP8 || in->num_shared_experts == 0, DG_ERR_VALUE,
             "the SM90 FP8 mega MoE has no shared experts, got num_shared_experts = %lld",
             (long long)in->num_shared_experts);
    DG_CHECK(in->num_shared_experts >= 0 && in->num_shared_experts <= 64 &&
                 in->num_shared_experts * in->intermediate_hidden <= (1 << 20),
             DG_ERR_VALUE,
             "num_shared_experts must be in [0, 64] with num_shared_experts * intermediate_hidden <= 2^20, got %lld",
             (long long)in->num_shared_experts);
    *out = *in;
    out->num_max_tokens_per_rank = dg_align(in->num_max_tokens_per_rank, in->mma == DG_MEGA_MOE_SM90_FP8
                                                                              ? SYMM_SM90_TOKEN_ALIGNMENT
                                                                              : SYMM_TOKEN_ALIGNMENT);
    return DG_OK;
}

/* offset = align(offset, page) + bytes, overflow-checked. */
static bool add_area(int64_t *cursor, int64_t *at, int64_t a, int64_t b, int64_t c) {
    int64_t n;
    if (!dg_mul_ok(a, b, &n) || !dg_mul_ok(n, c, &n))
        return false;
    *at = dg_align(*cursor, SYMM_PAGE);
    return !__builtin_add_overflow(*at, n, cursor);
}

bool dg_symm_compute_layout(const dg_mega_moe_config *cfg, dg_symm_layout *lay) {
    const int64_t T = cfg->num_max_tokens_per_rank, K = cfg->num_topk, H = cfg->hidden;
    const int bf16 = cfg->mma == DG_MEGA_MOE_BF16XBF16, nvfp4 = cfg->mma == DG_MEGA_MOE_FP4XFP4;
    int64_t cur = SYMM_PAGE, unused;
    lay->x_row = bf16 ? 2 * H : nvfp4 ? H / 2 : H;
    lay->sf_cols = bf16 ? 0 : nvfp4 ? H / 64 : dg_ceil_div(H, 128);
    if (!add_area(&cur, &lay->x, T, lay->x_row, 1) || !add_area(&cur, &lay->x_sf, T, lay->sf_cols, 4) ||
        !add_area(&cur, &lay->topk_idx, T, K, 8) || !add_area(&cur, &lay->topk_weights, T, K, 4) ||
        !add_area(&cur, &lay->combine, T * K, H, 2) || !add_area(&cur, &unused, 0, 0, 0))
        return false;
    lay->bytes = dg_align(cur, SYMM_PAGE);
    return lay->bytes <= SYMM_MAX_SEGMENT;
}

dg_status dg_get_symm_buffer_size_for_mega_moe(const dg_mega_moe_config *cfg, int64_t *bytes) {
    dg_api_begin("dg_get_symm_buffer_size_for_mega_moe");
    DG_CHECK(bytes != NULL, DG_ERR_NULL_POINTER, "argument 'bytes' is NULL");
    dg_mega_moe_config c = {0};
    DG_TRY(dg_symm_check_config(cfg, 0, &c));
    dg_symm_layout lay;
    DG_CHECK(dg_symm_compute_layout(&c, &lay), DG_ERR_OVERFLOW,
             "the symmetric buffer for this configuration exceeds 2^40 bytes per rank");
    *bytes = lay.bytes;
    return DG_OK;
}

static void shm_name(char *out, size_t cap, const char *name, int rank) {
    snprintf(out, cap, "/dg-moe.%s.%d", name, rank);
}

static dg_status check_name(const char *name) {
    DG_CHECK(name != NULL, DG_ERR_NULL_POINTER, "argument 'name' is NULL");
    const size_t n = strlen(name);
    DG_CHECK(n >= 1 && n <= 64, DG_ERR_VALUE, "argument 'name' must have 1 to 64 characters, got %zu", n);
    for (size_t i = 0; i < n; ++i) {
        const char c = name[i];
        DG_CHECK((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                     c == '.' || c == '-',
                 DG_ERR_VALUE, "argument 'name' may hold only [A-Za-z0-9_.-], got '%s'", name);
    }
    return DG_OK;
}

static double comm_timeout(void) {
    const char *s = getenv("DG_COMM_TIMEOUT");
    if (s && *s) {
        char *end;
        const double v = strtod(s, &end);
        if (end != s && v > 0 && v < 1e7)
            return v;
    }
    return 60.0;
}

static void free_buffer(dg_symm_buffer *b) {
    if (!b)
        return;
    dg_symm_net_free(b);
    if (b->peer) {
        for (int r = 0; r < b->cfg.num_ranks; ++r)
            if (b->peer[r] && r != b->cfg.rank)
                munmap(b->peer[r], (size_t)b->lay.bytes);
        dg_free(b->peer);
    }
    if (b->local)
        munmap(b->local, (size_t)b->lay.bytes);
    if (b->named) {
        char path[128];
        shm_name(path, sizeof path, b->name, b->cfg.rank);
        shm_unlink(path);
    }
    dg_free(b);
}

dg_status dg_symm_buffer_create(const dg_mega_moe_config *cfg, const char *name, dg_symm_buffer **out) {
    dg_api_begin("dg_symm_buffer_create");
    DG_CHECK(out != NULL, DG_ERR_NULL_POINTER, "argument 'out' is NULL");
    *out = NULL;
    dg_mega_moe_config c = {0};
    DG_TRY(dg_symm_check_config(cfg, 1, &c));
    DG_TRY(check_name(name));
    dg_symm_layout lay;
    DG_CHECK(dg_symm_compute_layout(&c, &lay), DG_ERR_OVERFLOW,
             "the symmetric buffer for this configuration exceeds 2^40 bytes per rank");

    dg_symm_buffer *b = dg_calloc(1, sizeof *b);
    char **peer = dg_calloc((size_t)c.num_ranks, sizeof *peer);
    if (!b || !peer) {
        dg_free(b);
        dg_free(peer);
        return dg_fail(DG_ERR_ALLOC, "cannot allocate the symmetric buffer's descriptor");
    }
    b->cfg = c;
    b->lay = lay;
    b->peer = peer;
    b->timeout = comm_timeout();
    snprintf(b->name, sizeof b->name, "%s", name);

    char path[128];
    shm_name(path, sizeof path, name, c.rank);
    const int fd = shm_open(path, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
        const int e = errno;
        free_buffer(b);
        return dg_fail(e == EEXIST ? DG_ERR_VALUE : DG_ERR_ALLOC,
                       "cannot create the shared memory segment %s: %s%s", path, strerror(e),
                       e == EEXIST ? " (another buffer uses this name; names must be unique)" : "");
    }
    b->named = 1;
    /* ftruncate only reserves; the pages are allocated as they are touched. posix_fallocate
     * makes a too-small /dev/shm an error here rather than a SIGBUS in the middle of a call. */
    int rc = ftruncate(fd, (off_t)lay.bytes);
    if (rc == 0)
        rc = posix_fallocate(fd, 0, (off_t)lay.bytes);
    if (rc != 0) {
        const int e = rc > 0 ? rc : errno;
        close(fd);
        free_buffer(b);
        return dg_fail(DG_ERR_ALLOC, "cannot reserve %lld bytes of shared memory for %s: %s",
                       (long long)lay.bytes, path, strerror(e));
    }
    void *p = mmap(NULL, (size_t)lay.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        const int e = errno;
        free_buffer(b);
        return dg_fail(DG_ERR_ALLOC, "cannot map the shared memory segment %s: %s", path, strerror(e));
    }
    b->local = p;
    b->peer[c.rank] = p;
    dg_symm_header *h = (dg_symm_header *)p; /* the segment is zero-filled */
    h->version = SYMM_VERSION;
    h->header_bytes = (uint32_t)sizeof *h;
    h->segment_bytes = lay.bytes;
    h->rank = c.rank;
    h->num_ranks = c.num_ranks;
    h->pid = (int32_t)getpid();
    h->mma = (int32_t)c.mma;
    h->num_experts = c.num_experts;
    h->num_max_tokens = c.num_max_tokens_per_rank;
    h->num_topk = c.num_topk;
    h->hidden = c.hidden;
    h->inter = c.intermediate_hidden;
    h->num_shared = c.num_shared_experts;
    snprintf(h->name, sizeof h->name, "%s", name);
    atomic_store_explicit(&h->arrive, 0, memory_order_relaxed);
    /* The magic last: a peer that sees it sees the rest (attach runs after a barrier anyway). */
    atomic_thread_fence(memory_order_release);
    h->magic = SYMM_MAGIC;
    *out = b;
    return DG_OK;
}

/* Peer r's header against this rank's configuration. */
static dg_status check_peer(const dg_symm_buffer *b, int r, const dg_symm_header *h, const char *path) {
    const dg_mega_moe_config *c = &b->cfg;
    DG_CHECK(h->magic == SYMM_MAGIC && h->version == SYMM_VERSION && h->header_bytes == sizeof *h,
             DG_ERR_VALUE, "segment %s is not a symmetric buffer of this library version", path);
    DG_CHECK(h->rank == r && h->num_ranks == c->num_ranks, DG_ERR_VALUE,
             "segment %s belongs to rank %d of %d, expected rank %d of %d", path, h->rank, h->num_ranks, r,
             c->num_ranks);
#define SAME(field, value, what)                                                                   \
    DG_CHECK((int64_t)(field) == (int64_t)(value), DG_ERR_VALUE,                                   \
             "the ranks passed different configurations: rank %d has %s = %lld, rank %d has %lld", r, \
             what, (long long)(field), c->rank, (long long)(value))
    SAME(h->mma, c->mma, "mma_type (0: fp8xfp4, 1: bf16xbf16, 2: fp8xfp8, 3: fp4xfp4, 4: SM90 fp8)");
    SAME(h->num_experts, c->num_experts, "num_experts");
    SAME(h->num_max_tokens, c->num_max_tokens_per_rank, "num_max_tokens_per_rank (aligned)");
    SAME(h->num_topk, c->num_topk, "num_topk");
    SAME(h->hidden, c->hidden, "hidden");
    SAME(h->inter, c->intermediate_hidden, "intermediate_hidden");
    SAME(h->num_shared, c->num_shared_experts, "num_shared_experts");
#undef SAME
    DG_CHECK(h->segment_bytes == b->lay.bytes, DG_ERR_VALUE, "segment %s has %lld bytes, expected %lld", path,
             (long long)h->segment_bytes, (long long)b->lay.bytes);
    return DG_OK;
}

dg_status dg_symm_buffer_attach(dg_symm_buffer *b) {
    dg_api_begin("dg_symm_buffer_attach");
    DG_CHECK(b != NULL, DG_ERR_NULL_POINTER, "argument 'buf' is NULL");
    DG_CHECK(!b->attached, DG_ERR_VALUE, "the symmetric buffer is already attached");
    for (int r = 0; r < b->cfg.num_ranks; ++r) {
        if (r == b->cfg.rank)
            continue;
        char path[128];
        shm_name(path, sizeof path, b->name, r);
        const int fd = shm_open(path, O_RDWR, 0);
        DG_CHECK(fd >= 0, DG_ERR_COMM,
                 "cannot open rank %d's segment %s: %s (every rank must call dg_symm_buffer_create with "
                 "the same name on this machine before any calls dg_symm_buffer_attach)",
                 r, path, strerror(errno));
        struct stat st;
        const int ok = fstat(fd, &st) == 0;
        if (!ok || st.st_uid != geteuid() || (st.st_mode & 077) || st.st_size != b->lay.bytes) {
            close(fd);
            return dg_fail(DG_ERR_VALUE,
                           "segment %s is not a peer's symmetric buffer (%s)", path,
                           !ok ? "cannot stat it"
                               : st.st_uid != geteuid() ? "owned by another user"
                               : (st.st_mode & 077)     ? "accessible to other users"
                                                        : "its size differs from this rank's configuration");
        }
        void *p = mmap(NULL, (size_t)b->lay.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        DG_CHECK(p != MAP_FAILED, DG_ERR_ALLOC, "cannot map rank %d's segment %s: %s", r, path, strerror(errno));
        b->peer[r] = p;
        atomic_thread_fence(memory_order_acquire);
        DG_TRY(check_peer(b, r, (const dg_symm_header *)p, path));
    }
    b->attached = 1;
    return DG_OK;
}

dg_status dg_symm_buffer_seal(dg_symm_buffer *b) {
    dg_api_begin("dg_symm_buffer_seal");
    DG_CHECK(b != NULL, DG_ERR_NULL_POINTER, "argument 'buf' is NULL");
    DG_CHECK(b->attached, DG_ERR_VALUE, "dg_symm_buffer_seal before dg_symm_buffer_attach");
    if (b->named) {
        char path[128];
        shm_name(path, sizeof path, b->name, b->cfg.rank);
        shm_unlink(path);
        b->named = 0;
    }
    b->sealed = 1;
    return DG_OK;
}

void dg_symm_buffer_destroy(dg_symm_buffer *b) { free_buffer(b); }

dg_status dg_symm_buffer_config(const dg_symm_buffer *b, dg_mega_moe_config *cfg) {
    dg_api_begin("dg_symm_buffer_config");
    DG_CHECK(b != NULL && cfg != NULL, DG_ERR_NULL_POINTER, "arguments 'buf' and 'cfg' must not be NULL");
    *cfg = b->cfg;
    return DG_OK;
}

dg_status dg_symm_buffer_view(const dg_symm_buffer *b, const char *field, dg_tensor *out) {
    dg_api_begin("dg_symm_buffer_view");
    DG_CHECK(b != NULL && field != NULL && out != NULL, DG_ERR_NULL_POINTER,
             "arguments 'buf', 'field' and 'out' must not be NULL");
    const int64_t T = b->cfg.num_max_tokens_per_rank, K = b->cfg.num_topk, H = b->cfg.hidden;
    const int fp8 = b->cfg.mma != DG_MEGA_MOE_BF16XBF16; /* tokens with scales */
    const dg_mega_moe_mma m = b->cfg.mma;
    if (!strcmp(field, "x") && m == DG_MEGA_MOE_FP4XFP4)
        *out = dg_tensor_2d(b->local + b->lay.x, DG_UINT8, T, H / 2); /* E2M1 pairs, as DeepGEMM's view */
    else if (!strcmp(field, "x"))
        *out = dg_tensor_2d(b->local + b->lay.x, fp8 ? DG_FLOAT8_E4M3 : DG_BFLOAT16, T, H);
    else if (!strcmp(field, "x_sf") && fp8)
        *out = dg_tensor_2d(b->local + b->lay.x_sf, m == DG_MEGA_MOE_SM90_FP8 ? DG_FLOAT32 : DG_INT32, T,
                            b->lay.sf_cols);
    else if (!strcmp(field, "topk_idx"))
        *out = dg_tensor_2d(b->local + b->lay.topk_idx, DG_INT64, T, K);
    else if (!strcmp(field, "topk_weights"))
        *out = dg_tensor_2d(b->local + b->lay.topk_weights, DG_FLOAT32, T, K);
    else
        return dg_fail(DG_ERR_VALUE, "argument 'field': no view '%s' (x, %stopk_idx, topk_weights)", field,
                       fp8 ? "x_sf, " : "");
    return DG_OK;
}
