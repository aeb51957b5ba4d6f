/*
 * mega_moe_fused.c - entry points of the fused mega MoE calls (include/deepgemm.h, section
 * mega-moe): this rank's argument checks, the dispatch and combine barriers with the other
 * ranks (src/comm/barrier.c), and the expert work between them (src/engine/mega_moe.c).
 *
 * Every call passes both barriers, whatever fails, so that the ranks' counters stay in step: a
 * rank whose arguments are invalid posts its failure at the dispatch barrier and still posts at
 * the combine barrier; only a lost peer (DG_ERR_COMM) ends a call early, and leaves the buffer
 * unusable.
 */
#include "core/internal.h"
#include "core/operand.h"
#include "engine/mega_moe.h"
#include "engine/prepack.h"
#include "reference/ref_mega_moe.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct fused_args {
    int fp8;                                      /* FP8 tokens: fp8xfp4 or fp8xfp8 */
    int nvfp4;                                    /* dg_fp4_fp4_mega_moe: fp4xfp4, with ex */
    int sm90;                                     /* dg_fp8_mega_moe: the SM90 buffer, block scales */
    dg_fp4_fp4_mega_moe_extras ex;
    const dg_tensor *y, *l1, *l1_sf, *l2, *l2_sf, *stats;
    const dg_tensor *sh1, *sh1_sf, *sh2, *sh2_sf; /* the shared expert(s), NULL without */
    int packed;                                   /* the `_packed` calls: the weights below instead */
    const dg_packed_b *p1, *p2, *ps1, *ps2;       /* routed L1, L2 (grouped); shared L1, L2 (dense) */
    float clamp;
    int situ;                                     /* the `_situ` calls: SiTU with these betas */
    float situ_beta, situ_linear_beta;
} fused_args;

static const char *mma_name(dg_mega_moe_mma m) {
    return m == DG_MEGA_MOE_FP8XFP4   ? "fp8xfp4"
           : m == DG_MEGA_MOE_FP8XFP8 ? "fp8xfp8"
           : m == DG_MEGA_MOE_FP4XFP4 ? "fp4xfp4"
           : m == DG_MEGA_MOE_SM90_FP8 ? "SM90 fp8"
                                      : "bf16xbf16";
}

/* The routed experts' weight dtype of a buffer's mma_type. */
static dg_dtype routed_dtype(dg_mega_moe_mma m) {
    return m == DG_MEGA_MOE_FP8XFP4 || m == DG_MEGA_MOE_FP4XFP4 ? DG_FP4_E2M1X2
           : m == DG_MEGA_MOE_FP8XFP8 || m == DG_MEGA_MOE_SM90_FP8 ? DG_FLOAT8_E4M3
                                                               : DG_BFLOAT16;
}

/* Scale granularity along K of the routed weights: NVFP4's 16, else per-1x32. */
static int weight_gran(const fused_args *a) { return a->nvfp4 ? 16 : DG_MEGA_MOE_ACT_GRAN; }

/* One weight tensor of this rank's E/R experts: [E/R, rows, cols] logical. */
static dg_status check_weight(const fused_args *a, const dg_symm_buffer *b, int layer, dg_operand *op,
                              int64_t rows, int64_t cols) {
    const char *name = layer == 1 ? "l1_weights" : "l2_weights";
    const dg_dtype want = routed_dtype(b->cfg.mma);
    DG_TRY(dg_operand_init(op, name, layer == 1 ? a->l1 : a->l2, 1, &want, 1));
    DG_CHECK(want != DG_FP4_E2M1X2 || op->fp4_dim == 2, DG_ERR_LAYOUT,
             "argument '%s': packed FP4 weights must be K-major (unit stride in the last dimension)", name);
    const int64_t epr = b->cfg.num_experts / b->cfg.num_ranks;
    DG_CHECK(op->groups == epr && op->mn == rows && op->k == cols, DG_ERR_SHAPE,
             "argument '%s' must be [%lld, %lld, %lld] (logical: experts of this rank, %s), got [%lld, %lld, %lld]",
             name, (long long)epr, (long long)rows, (long long)cols,
             layer == 1 ? "2 * intermediate_hidden, hidden" : "hidden, intermediate_hidden", (long long)op->groups,
             (long long)op->mn, (long long)op->k);
    const char *sf_name = layer == 1 ? "l1_weights_sf" : "l2_weights_sf";
    const dg_tensor *sf = layer == 1 ? a->l1_sf : a->l2_sf;
    if (a->sm90) { /* float32 per 128x128 block, as DeepGEMM's SM90 kernel reads them */
        DG_CHECK(sf != NULL, DG_ERR_NULL_POINTER, "argument '%s' is NULL", sf_name);
        DG_CHECK(sf->dtype == DG_FLOAT32, DG_ERR_DTYPE,
                 "argument '%s' must be FLOAT32 (one scale per 128x128 block), got %s", sf_name,
                 dg_dtype_name(sf->dtype));
        return dg_operand_set_scales(op, sf_name, sf, 128, 128);
    }
    if (a->fp8 || a->nvfp4)
        DG_TRY(dg_operand_set_scales(op, sf_name, sf, 1, weight_gran(a)));
    return DG_OK;
}

/* The NVFP4 call's BF16 tokens for its shared experts, x_bf16 [T_r, H]: given exactly when the
 * shared weights are (`shared`, raw or packed). */
static dg_status check_x_bf16(const fused_args *a, const dg_symm_buffer *b, bool shared) {
    const dg_tensor *xb = a->ex.x_bf16;
    const int64_t H = b->cfg.hidden;
    DG_CHECK(shared == (xb != NULL), DG_ERR_VALUE,
             "arguments 'shared_l1_weights', 'shared_l2_weights' and 'x_bf16' must be given together");
    if (!xb)
        return DG_OK;
    DG_TRY(dg_check_tensor_dtype(xb, "x_bf16", 2, DG_BFLOAT16));
    DG_CHECK(xb->shape[0] == a->y->shape[0] && xb->shape[1] == H, DG_ERR_SHAPE,
             "argument 'x_bf16' must be [%lld, %lld] (y's tokens, hidden), got [%lld, %lld]",
             (long long)a->y->shape[0], (long long)H, (long long)xb->shape[0], (long long)xb->shape[1]);
    return dg_check_no_overlap(a->y, "y", xb, "x_bf16", false);
}

/* The shared experts' weights: [2 S I, H] and [H, S I], FP8 with per-1x32 scales or BF16 (the
 * NVFP4 call's, with their BF16 tokens x_bf16). */
static dg_status check_shared(const fused_args *a, const dg_symm_buffer *b) {
    const int64_t S = b->cfg.num_shared_experts, SI = S * b->cfg.intermediate_hidden, H = b->cfg.hidden;
    const int given = a->sh1 || a->sh2;
    if (a->nvfp4)
        DG_TRY(check_x_bf16(a, b, a->sh1 && a->sh2));
    DG_CHECK(S == 0 || (a->sh1 && a->sh2), DG_ERR_NULL_POINTER,
             "the symmetric buffer was created with num_shared_experts = %lld: arguments 'shared_l1_weights' and "
             "'shared_l2_weights' are required", (long long)S);
    DG_CHECK(S > 0 || !given, DG_ERR_VALUE,
             "shared expert weights were given, but the symmetric buffer was created with num_shared_experts = 0");
    if (S == 0)
        return DG_OK;
    const dg_dtype want = a->fp8 ? DG_FLOAT8_E4M3 : DG_BFLOAT16; /* NVFP4's are BF16 */
    const struct { const dg_tensor *w, *sf; const char *name, *sf_name; int64_t rows, cols; } ws[2] = {
        {a->sh1, a->sh1_sf, "shared_l1_weights", "shared_l1_weights_sf", 2 * SI, H},
        {a->sh2, a->sh2_sf, "shared_l2_weights", "shared_l2_weights_sf", H, SI}};
    for (int i = 0; i < 2; ++i) {
        dg_operand op;
        DG_TRY(dg_operand_init(&op, ws[i].name, ws[i].w, 0, &want, 1));
        DG_CHECK(op.mn == ws[i].rows && op.k == ws[i].cols, DG_ERR_SHAPE,
                 "argument '%s' must be [%lld, %lld] (num_shared_experts = %lld), got [%lld, %lld]", ws[i].name,
                 (long long)ws[i].rows, (long long)ws[i].cols, (long long)S, (long long)op.mn, (long long)op.k);
        if (a->fp8)
            DG_TRY(dg_operand_set_scales(&op, ws[i].sf_name, ws[i].sf, 1, DG_MEGA_MOE_ACT_GRAN));
        DG_TRY(dg_check_no_overlap(a->y, "y", ws[i].w, ws[i].name, false));
        if (a->fp8)
            DG_TRY(dg_check_no_overlap(a->y, "y", ws[i].sf, ws[i].sf_name, false));
    }
    return DG_OK;
}

/* One pre-packed weight of the `_packed` calls: live, packed for the current kernel, with the
 * dtype, recipe, group count and shape the configuration asks for. */
static dg_status check_packed_weight(const dg_packed_b *p, const char *name, dg_dtype want, int gran, int64_t groups,
                                     int64_t rows, int64_t cols) {
    DG_CHECK(p != NULL, DG_ERR_NULL_POINTER, "argument '%s' is NULL", name);
    DG_CHECK(p->magic == DG_PACKED_B_MAGIC, DG_ERR_VALUE, "argument '%s' is not a live dg_packed_b (freed?)", name);
    DG_CHECK(p->dtype == want, DG_ERR_DTYPE, "argument '%s' was packed from %s weights; this call takes %s", name,
             dg_dtype_name(p->dtype), dg_dtype_name(want));
    /* gran 128: the SM90 call's 128x128 blocks */
    const int gran_n = gran == 128 ? 128 : 1;
    DG_CHECK(want == DG_BFLOAT16 || (p->gran_b[0] == gran_n && p->gran_b[1] == gran), DG_ERR_VALUE,
             "argument '%s' was packed with B granularity (%d, %d); this mega MoE's weights have %s scales "
             "(pack with %s)",
             name, p->gran_b[0], p->gran_b[1], gran == 128 ? "128x128 block" : gran == 16 ? "per-1x16" : "per-1x32",
             gran == 128 ? "recipe_b (128, 128)" : gran == 16 ? "recipe (1, 1, 16)" : "recipe (1, 1, 32)");
    if (groups > 0)
        DG_CHECK(p->groups == groups, DG_ERR_VALUE,
                 "argument '%s' must hold %lld groups (dg_pack_b_grouped of this rank's experts), got %lld", name,
                 (long long)groups, (long long)p->groups);
    else
        DG_CHECK(p->groups == 0, DG_ERR_VALUE, "argument '%s' must be a dense packed B (dg_pack_b), got %lld groups",
                 name, (long long)p->groups);
    DG_CHECK(p->n == rows && p->k == cols, DG_ERR_SHAPE, "argument '%s' must be packed from [%s%lld, %lld], got [%lld, %lld]",
             name, groups ? "E/R, " : "", (long long)rows, (long long)cols, (long long)p->n, (long long)p->k);
    const dg_engine_cfg *cfg;
    if (dg_engine_prepacked_cfg(p, &cfg) != DG_OK)
        return dg_fail(DG_ERR_VALUE,
                       "argument '%s' was packed for the '%s' kernel, but the current ISA runs '%s' (dg_set_isa "
                       "changed it since); pack the weights again",
                       name, p->cfg->name, dg_engine_config(dg_get_isa())->name);
    return DG_OK;
}

static dg_status check_packed(const fused_args *a, const dg_symm_buffer *b) {
    const dg_mega_moe_config *cfg = &b->cfg;
    const int64_t epr = cfg->num_experts / cfg->num_ranks, H = cfg->hidden, I = cfg->intermediate_hidden;
    const int64_t S = cfg->num_shared_experts;
    DG_CHECK(!dg_use_reference(), DG_ERR_UNSUPPORTED,
             "pre-packed weights run on the engine only; the reference backend is selected");
    const dg_dtype routed = routed_dtype(cfg->mma), shared = a->fp8 ? DG_FLOAT8_E4M3 : DG_BFLOAT16;
    const int gran = a->sm90 ? 128 : weight_gran(a);
    DG_TRY(check_packed_weight(a->p1, "l1_weights", routed, gran, epr, 2 * I, H));
    DG_TRY(check_packed_weight(a->p2, "l2_weights", routed, gran, epr, H, I));
    if (a->nvfp4)
        DG_TRY(check_x_bf16(a, b, a->ps1 && a->ps2));
    DG_CHECK(S == 0 || (a->ps1 && a->ps2), DG_ERR_NULL_POINTER,
             "the symmetric buffer was created with num_shared_experts = %lld: arguments 'shared_l1_weights' and "
             "'shared_l2_weights' are required", (long long)S);
    DG_CHECK(S > 0 || (!a->ps1 && !a->ps2), DG_ERR_VALUE,
             "shared expert weights were given, but the symmetric buffer was created with num_shared_experts = 0");
    if (S > 0) {
        DG_TRY(check_packed_weight(a->ps1, "shared_l1_weights", shared, DG_MEGA_MOE_ACT_GRAN, 0, 2 * S * I, H));
        DG_TRY(check_packed_weight(a->ps2, "shared_l2_weights", shared, DG_MEGA_MOE_ACT_GRAN, 0, H, S * I));
    }
    return DG_OK;
}

/* The segment as a byte tensor, for the overlap checks. */
static dg_tensor segment_tensor(const dg_symm_buffer *b) {
    return dg_tensor_1d(b->local, DG_INT8, b->lay.bytes);
}

/* The NVFP4 call's per-expert scales: FLOAT32 [E/R, cols] (a 1-D [E/R] when cols is 0). */
static dg_status check_expert_scales(const fused_args *a, const dg_tensor *t, const char *name, int64_t epr,
                                     int64_t cols, bool positive) {
    if (!t)
        return DG_OK;
    DG_TRY(dg_check_tensor_dtype(t, name, cols ? 2 : 1, DG_FLOAT32));
    DG_TRY(dg_check_dim(t, name, 0, epr));
    if (cols)
        DG_TRY(dg_check_dim(t, name, 1, cols));
    DG_TRY(dg_check_no_overlap(a->y, "y", t, name, false));
    if (a->stats)
        DG_TRY(dg_check_no_overlap(a->stats, "cumulative_local_expert_recv_stats", t, name, false));
    for (int64_t e = 0; positive && e < epr; ++e) {
        const float v = ((const float *)t->data)[e * t->strides[0]];
        DG_CHECK(isfinite(v) && v > 0.0f, DG_ERR_VALUE, "argument '%s': entry %lld is %g; each must be finite and > 0",
                 name, (long long)e, (double)v);
    }
    return DG_OK;
}

static dg_status check_local(const fused_args *a, dg_symm_buffer *b) {
    const dg_mega_moe_config *cfg = &b->cfg;
    const dg_mega_moe_mma m = cfg->mma;
    const bool fits = a->nvfp4  ? m == DG_MEGA_MOE_FP4XFP4
                      : a->sm90 ? m == DG_MEGA_MOE_SM90_FP8
                      : a->fp8  ? m == DG_MEGA_MOE_FP8XFP4 || m == DG_MEGA_MOE_FP8XFP8
                                : m == DG_MEGA_MOE_BF16XBF16;
    DG_CHECK(fits, DG_ERR_VALUE, "the symmetric buffer was created for mma_type '%s'; this call needs %s",
             mma_name(m),
             a->nvfp4  ? "'fp4xfp4'"
             : a->sm90 ? "the SM90 buffer (DG_MEGA_MOE_SM90_FP8, get_symm_buffer_for_sm90_mega_moe)"
             : a->fp8  ? "'fp8xfp4' or 'fp8xfp8'"
                       : "'bf16xbf16'");
    DG_CHECK(!a->situ || cfg->mma == DG_MEGA_MOE_FP8XFP4, DG_ERR_VALUE,
             "SiTU is the FP8 x FP4 mega MoE's (DeepGEMM 2.8); the symmetric buffer was created for mma_type '%s'",
             mma_name(cfg->mma));
    DG_CHECK(!isnan(a->clamp) && a->clamp >= 0.0f, DG_ERR_VALUE,
             "argument 'activation_clamp' must be >= 0 (INFINITY for none), got %g", (double)a->clamp);
    if (a->situ) {
        DG_CHECK(isfinite(a->situ_beta) && a->situ_beta > 0.0f && isfinite(a->situ_linear_beta) &&
                     a->situ_linear_beta > 0.0f,
                 DG_ERR_VALUE, "arguments 'situ_beta' and 'situ_linear_beta' must be finite and > 0, got %g and %g",
                 (double)a->situ_beta, (double)a->situ_linear_beta);
    }
    DG_TRY(dg_check_tensor_dtype(a->y, "y", 2, DG_BFLOAT16));
    DG_TRY(dg_check_dim(a->y, "y", 1, cfg->hidden));
    DG_CHECK(a->y->shape[0] <= cfg->num_max_tokens_per_rank, DG_ERR_SHAPE,
             "argument 'y': %lld tokens, more than the buffer's num_max_tokens_per_rank = %lld",
             (long long)a->y->shape[0], (long long)cfg->num_max_tokens_per_rank);
    DG_TRY(dg_check_output(a->y, "y"));
    if (a->packed) {
        DG_TRY(check_packed(a, b));
    } else {
        dg_operand l1, l2;
        DG_TRY(check_weight(a, b, 1, &l1, 2 * cfg->intermediate_hidden, cfg->hidden));
        DG_TRY(check_weight(a, b, 2, &l2, cfg->hidden, cfg->intermediate_hidden));
        DG_TRY(check_shared(a, b));
    }
    if (a->stats) {
        const char *s = "cumulative_local_expert_recv_stats";
        DG_TRY(dg_check_tensor_dtype(a->stats, s, 1, DG_INT32));
        DG_TRY(dg_check_dim(a->stats, s, 0, cfg->num_experts / cfg->num_ranks));
        DG_TRY(dg_check_contiguous(a->stats, s));
    }
    if (a->nvfp4) {
        const int64_t epr = cfg->num_experts / cfg->num_ranks;
        DG_CHECK(isfinite(a->ex.routed_scaling_factor), DG_ERR_VALUE,
                 "argument 'routed_scaling_factor' must be finite, got %g", (double)a->ex.routed_scaling_factor);
        DG_TRY(check_expert_scales(a, a->ex.l1_alphas, "l1_alphas", epr, 2, false));
        DG_TRY(check_expert_scales(a, a->ex.l2_alphas, "l2_alphas", epr, 0, false));
        DG_TRY(check_expert_scales(a, a->ex.a2_scales, "a2_scales", epr, 0, true));
    }
    /* Outputs overlap neither each other, nor the weights, nor the symmetric buffer. */
    const dg_tensor seg = segment_tensor(b);
    const struct { const dg_tensor *t; const char *name; } ins[] = {
        {a->l1, "l1_weights"}, {a->l1_sf, "l1_weights_sf"}, {a->l2, "l2_weights"},
        {a->l2_sf, "l2_weights_sf"}, {&seg, "the symmetric buffer"}, {a->stats, "cumulative_local_expert_recv_stats"}};
    const int n_ins = (int)(sizeof ins / sizeof ins[0]);
    for (int i = 0; i < n_ins; ++i) {
        if (!ins[i].t)
            continue;
        DG_TRY(dg_check_no_overlap(a->y, "y", ins[i].t, ins[i].name, false));
        if (a->stats && i != n_ins - 1)
            DG_TRY(dg_check_no_overlap(a->stats, "cumulative_local_expert_recv_stats", ins[i].t, ins[i].name,
                                       false));
    }
    return DG_OK;
}

/* The thread's message without its "entry point: " prefix, which dg_fail adds again. */
/* Phase A or B over shared memory or MPI; tokens (phase A) receives every rank's T. */
static dg_status sync_ranks(dg_symm_buffer *b, uint64_t value, dg_status mine, const char *msg, int64_t num_tokens,
                            int64_t *tokens) {
    if (b->net)
        return dg_symm_net_barrier(b, value, mine, msg, num_tokens, tokens);
    dg_status st = dg_symm_barrier(b, value, mine, msg, num_tokens);
    for (int r = 0; tokens && !b->broken && r < b->cfg.num_ranks; ++r)
        tokens[r] = dg_symm_hdr(b, r)->post[value % 2].num_tokens;
    return st;
}

static void keep_message(char *dst, size_t cap) {
    const char *m = dg_last_error(), *api = dg_api_name();
    const size_t n = strlen(api);
    if (!strncmp(m, api, n) && m[n] == ':' && m[n + 1] == ' ')
        m += n + 2;
    snprintf(dst, cap, "%s", m);
}

static dg_status fused(const fused_args *a, dg_symm_buffer *b) {
    DG_CHECK(b != NULL, DG_ERR_NULL_POINTER, "argument 'buf' (the symmetric buffer) is NULL");
    DG_CHECK(b->attached, DG_ERR_VALUE,
             "the symmetric buffer is not attached (dg_symm_buffer_attach on every rank first)");
    DG_CHECK(!b->broken, DG_ERR_COMM,
             "the symmetric buffer is unusable: an earlier call lost a peer rank (destroy it and create a new one)");
    const int R = b->cfg.num_ranks;
    const uint64_t call = ++b->calls;
    char msg_a[DG_SYMM_MSG_BYTES], msg_c[DG_SYMM_MSG_BYTES];

    dg_status mine = check_local(a, b);
    int64_t *tokens = NULL, *recv = NULL;
    void *scratch = NULL;
    uint16_t *shared_y = NULL;
    const int threads = dg_num_threads();
    if (mine == DG_OK) {
        tokens = dg_calloc((size_t)R, sizeof *tokens);
        recv = dg_calloc((size_t)(b->cfg.num_experts / R) + 1, sizeof *recv);
        scratch = dg_malloc(dg_mega_moe_combine_scratch_bytes(b, threads));
        if (b->cfg.num_shared_experts > 0)
            shared_y = dg_malloc((size_t)(a->y->shape[0] * b->cfg.hidden + 1) * 2);
        if (!tokens || !recv || !scratch || (b->cfg.num_shared_experts > 0 && !shared_y))
            mine = dg_fail(DG_ERR_ALLOC, "cannot allocate the call's routing tables");
    }
    keep_message(msg_a, sizeof msg_a);

    /* Phase A: every rank's inputs are in its buffer, and every rank's arguments are valid. */
    dg_status st = sync_ranks(b, 2 * call - 1, mine, msg_a, a->y && mine == DG_OK ? a->y->shape[0] : 0,
                              mine == DG_OK ? tokens : NULL);
    if (b->broken)
        goto done;
    keep_message(msg_a, sizeof msg_a);

    dg_status work = DG_OK;
    dg_mega_moe_call c = {.buf = b, .fp8 = a->fp8, .nvfp4 = a->nvfp4, .sm90 = a->sm90, .x_bf16 = a->ex.x_bf16,
                          .l1_alphas = a->ex.l1_alphas, .l2_alphas = a->ex.l2_alphas, .a2_scales = a->ex.a2_scales,
                          .routed_scaling_factor = a->ex.routed_scaling_factor, .y = a->y, .l1 = a->l1,
                          .l1_sf = a->l1_sf, .l2 = a->l2, .l2_sf = a->l2_sf, .stats = a->stats, .shared_l1 = a->sh1, .shared_l1_sf = a->sh1_sf,
                          .shared_l2 = a->sh2, .shared_l2_sf = a->sh2_sf, .l1p = a->p1, .l2p = a->p2,
                          .shared_l1p = a->ps1, .shared_l2p = a->ps2, .shared_y = shared_y, .clamp = a->clamp,
                          .situ = a->situ, .situ_beta = a->situ_beta, .situ_linear_beta = a->situ_linear_beta,
                          .num_tokens = tokens, .recv = recv};
    if (st == DG_OK) {
        /* The reference's rule (the GPU clamps BF16 values); SM90 clamps float32 ones as given. */
        if (!isinf(c.clamp) && !a->sm90)
            c.clamp = dg_bf16_to_float(dg_float_to_bf16(c.clamp));
        if (b->net)
            work = dg_symm_net_dispatch(b, tokens);
        if (work == DG_OK)
            work = dg_mega_moe_experts(&c);
        if (b->net) { /* every rank joins the combine exchange, whatever its expert work gave */
            char keep[DG_SYMM_MSG_BYTES];
            keep_message(keep, sizeof keep);
            const dg_status cs = dg_symm_net_combine(b, tokens);
            if (work == DG_OK)
                work = cs;
            else {
                dg_api_begin(dg_api_name());
                dg_fail(work, "%s", keep);
            }
        }
    }
    keep_message(msg_c, sizeof msg_c);

    /* Phase B: every expert output row is in its source rank's combine area. */
    const dg_status sb = sync_ranks(b, 2 * call, st != DG_OK ? st : work, st != DG_OK ? msg_a : msg_c, 0, NULL);
    if (b->broken) {
        st = sb;
        goto done;
    }
    if (st != DG_OK) { /* phase A's failure, with its message */
        dg_api_begin(dg_api_name());
        st = dg_fail(st, "%s", msg_a);
        goto done;
    }
    if (sb != DG_OK) {
        st = sb;
        if (work != DG_OK) { /* this rank's own failure: keep its message */
            dg_api_begin(dg_api_name());
            st = dg_fail(work, "%s", msg_c);
        }
        goto done;
    }
    dg_mega_moe_combine(&c, scratch, threads);
    DG_PATH("%s, %d rank%s; expert waves on %s%s%s",
            b->net ? "network path (MPI)" : "symmetric buffer over shared memory", R, R == 1 ? "" : "s",
            a->sm90 && !a->packed ? "dg_fp8_gemm_nt" : a->fp8 || a->nvfp4 || a->sm90 ? "dg_fp8_fp4_gemm_nt" : "dg_bf16_gemm_nt",
            a->packed ? "_packed (pre-packed weights)" : " (weights packed per wave)",
            a->nvfp4 ? ", NVFP4 recipe (1, 1, 16)" : a->sm90 ? ", SM90 block scales (128, 128)" : "");
done:
    dg_free(tokens);
    dg_free(recv);
    dg_free(scratch);
    dg_free(shared_y);
    return st;
}

dg_status dg_fp8_fp4_mega_moe(const dg_tensor *y, const dg_tensor *l1_weights, const dg_tensor *l1_weights_sf,
                              const dg_tensor *l2_weights, const dg_tensor *l2_weights_sf,
                              const dg_tensor *shared_l1_weights, const dg_tensor *shared_l1_weights_sf,
                              const dg_tensor *shared_l2_weights, const dg_tensor *shared_l2_weights_sf,
                              dg_symm_buffer *buf, const dg_tensor *cumulative_local_expert_recv_stats,
                              float activation_clamp) {
    dg_api_begin("dg_fp8_fp4_mega_moe");
    const fused_args a = {.fp8 = 1, .y = y, .l1 = l1_weights, .l1_sf = l1_weights_sf, .l2 = l2_weights,
                          .l2_sf = l2_weights_sf, .stats = cumulative_local_expert_recv_stats,
                          .sh1 = shared_l1_weights, .sh1_sf = shared_l1_weights_sf, .sh2 = shared_l2_weights,
                          .sh2_sf = shared_l2_weights_sf, .clamp = activation_clamp};
    return fused(&a, buf);
}

dg_status dg_bf16_mega_moe(const dg_tensor *y, const dg_tensor *l1_weights, const dg_tensor *l2_weights,
                           const dg_tensor *shared_l1_weights, const dg_tensor *shared_l2_weights,
                           dg_symm_buffer *buf, const dg_tensor *cumulative_local_expert_recv_stats,
                           float activation_clamp) {
    dg_api_begin("dg_bf16_mega_moe");
    const fused_args a = {.fp8 = 0, .y = y, .l1 = l1_weights, .l2 = l2_weights, .sh1 = shared_l1_weights,
                          .sh2 = shared_l2_weights, .stats = cumulative_local_expert_recv_stats,
                          .clamp = activation_clamp};
    return fused(&a, buf);
}

dg_status dg_fp8_fp4_mega_moe_packed(const dg_tensor *y, const dg_packed_b *l1_weights, const dg_packed_b *l2_weights,
                                     const dg_packed_b *shared_l1_weights, const dg_packed_b *shared_l2_weights,
                                     dg_symm_buffer *buf, const dg_tensor *cumulative_local_expert_recv_stats,
                                     float activation_clamp) {
    dg_api_begin("dg_fp8_fp4_mega_moe_packed");
    const fused_args a = {.fp8 = 1, .y = y, .packed = 1, .p1 = l1_weights, .p2 = l2_weights, .ps1 = shared_l1_weights,
                          .ps2 = shared_l2_weights, .stats = cumulative_local_expert_recv_stats,
                          .clamp = activation_clamp};
    return fused(&a, buf);
}

dg_status dg_bf16_mega_moe_packed(const dg_tensor *y, const dg_packed_b *l1_weights, const dg_packed_b *l2_weights,
                                  const dg_packed_b *shared_l1_weights, const dg_packed_b *shared_l2_weights,
                                  dg_symm_buffer *buf, const dg_tensor *cumulative_local_expert_recv_stats,
                                  float activation_clamp) {
    dg_api_begin("dg_bf16_mega_moe_packed");
    const fused_args a = {.fp8 = 0, .y = y, .packed = 1, .p1 = l1_weights, .p2 = l2_weights, .ps1 = shared_l1_weights,
                          .ps2 = shared_l2_weights, .stats = cumulative_local_expert_recv_stats,
                          .clamp = activation_clamp};
    return fused(&a, buf);
}

dg_status dg_fp8_fp4_mega_moe_situ(const dg_tensor *y, const dg_tensor *l1_weights, const dg_tensor *l1_weights_sf,
                                   const dg_tensor *l2_weights, const dg_tensor *l2_weights_sf,
                                   const dg_tensor *shared_l1_weights, const dg_tensor *shared_l1_weights_sf,
                                   const dg_tensor *shared_l2_weights, const dg_tensor *shared_l2_weights_sf,
                                   dg_symm_buffer *buf, const dg_tensor *cumulative_local_expert_recv_stats,
                                   float situ_beta, float situ_linear_beta) {
    dg_api_begin("dg_fp8_fp4_mega_moe_situ");
    const fused_args a = {.fp8 = 1, .y = y, .l1 = l1_weights, .l1_sf = l1_weights_sf, .l2 = l2_weights,
                          .l2_sf = l2_weights_sf, .stats = cumulative_local_expert_recv_stats,
                          .sh1 = shared_l1_weights, .sh1_sf = shared_l1_weights_sf, .sh2 = shared_l2_weights,
                          .sh2_sf = shared_l2_weights_sf, .clamp = INFINITY, .situ = 1, .situ_beta = situ_beta,
                          .situ_linear_beta = situ_linear_beta};
    return fused(&a, buf);
}

dg_status dg_fp8_fp4_mega_moe_packed_situ(const dg_tensor *y, const dg_packed_b *l1_weights,
                                          const dg_packed_b *l2_weights, const dg_packed_b *shared_l1_weights,
                                          const dg_packed_b *shared_l2_weights, dg_symm_buffer *buf,
                                          const dg_tensor *cumulative_local_expert_recv_stats, float situ_beta,
                                          float situ_linear_beta) {
    dg_api_begin("dg_fp8_fp4_mega_moe_packed_situ");
    const fused_args a = {.fp8 = 1, .y = y, .packed = 1, .p1 = l1_weights, .p2 = l2_weights, .ps1 = shared_l1_weights,
                          .ps2 = shared_l2_weights, .stats = cumulative_local_expert_recv_stats, .clamp = INFINITY,
                          .situ = 1, .situ_beta = situ_beta, .situ_linear_beta = situ_linear_beta};
    return fused(&a, buf);
}

dg_fp4_fp4_mega_moe_extras dg_fp4_fp4_mega_moe_extras_default(void) {
    dg_fp4_fp4_mega_moe_extras e = {0};
    e.routed_scaling_factor = 1.0f;
    return e;
}

dg_status dg_fp4_fp4_mega_moe(const dg_tensor *y, const dg_tensor *l1_weights, const dg_tensor *l1_weights_sf,
                              const dg_tensor *l2_weights, const dg_tensor *l2_weights_sf,
                              const dg_fp4_fp4_mega_moe_extras *extras, dg_symm_buffer *buf,
                              const dg_tensor *cumulative_local_expert_recv_stats, float activation_clamp) {
    dg_api_begin("dg_fp4_fp4_mega_moe");
    fused_args a = {.nvfp4 = 1, .ex = extras ? *extras : dg_fp4_fp4_mega_moe_extras_default(), .y = y,
                    .l1 = l1_weights, .l1_sf = l1_weights_sf, .l2 = l2_weights, .l2_sf = l2_weights_sf,
                    .stats = cumulative_local_expert_recv_stats, .clamp = activation_clamp};
    a.sh1 = a.ex.shared_l1_weights, a.sh2 = a.ex.shared_l2_weights;
    return fused(&a, buf);
}

dg_status dg_fp4_fp4_mega_moe_packed(const dg_tensor *y, const dg_packed_b *l1_weights, const dg_packed_b *l2_weights,
                                     const dg_packed_b *shared_l1_weights, const dg_packed_b *shared_l2_weights,
                                     const dg_fp4_fp4_mega_moe_extras *extras, dg_symm_buffer *buf,
                                     const dg_tensor *cumulative_local_expert_recv_stats, float activation_clamp) {
    dg_api_begin("dg_fp4_fp4_mega_moe_packed");
    fused_args a = {.nvfp4 = 1, .ex = extras ? *extras : dg_fp4_fp4_mega_moe_extras_default(), .y = y,
                    .packed = 1, .p1 = l1_weights, .p2 = l2_weights, .ps1 = shared_l1_weights,
                    .ps2 = shared_l2_weights, .stats = cumulative_local_expert_recv_stats, .clamp = activation_clamp};
    DG_CHECK(!a.ex.shared_l1_weights && !a.ex.shared_l2_weights, DG_ERR_VALUE,
             "the packed call takes its shared experts as packed arguments; extras' shared_l1_weights and "
             "shared_l2_weights must be NULL");
    return fused(&a, buf);
}

dg_status dg_fp8_mega_moe(const dg_tensor *y, const dg_tensor *l1_weights, const dg_tensor *l1_weights_sf,
                          const dg_tensor *l2_weights, const dg_tensor *l2_weights_sf, dg_symm_buffer *buf,
                          const dg_tensor *cumulative_local_expert_recv_stats, float activation_clamp) {
    dg_api_begin("dg_fp8_mega_moe");
    const fused_args a = {.sm90 = 1, .y = y, .l1 = l1_weights, .l1_sf = l1_weights_sf, .l2 = l2_weights,
                          .l2_sf = l2_weights_sf, .stats = cumulative_local_expert_recv_stats,
                          .clamp = activation_clamp};
    return fused(&a, buf);
}

dg_status dg_fp8_mega_moe_packed(const dg_tensor *y, const dg_packed_b *l1_weights, const dg_packed_b *l2_weights,
                                 dg_symm_buffer *buf, const dg_tensor *cumulative_local_expert_recv_stats,
                                 float activation_clamp) {
    dg_api_begin("dg_fp8_mega_moe_packed");
    const fused_args a = {.sm90 = 1, .y = y, .packed = 1, .p1 = l1_weights, .p2 = l2_weights,
                          .stats = cumulative_local_expert_recv_stats, .clamp = activation_clamp};
    return fused(&a, buf);
}
