/*
 * gemm_packed.c - dense GEMMs on a pre-packed B (the weight): dg_pack_b packs B once into the
 * engine's panels (src/engine/prepack.c, format in engine.h), the `_nt_packed` GEMMs take it.
 * D is bitwise what the unpacked `_nt` call gives on the same inputs under the same ISA.
 * Every argument is validated before anything is written, as in gemm_dense.c.
 */
#include "../core/operand.h"
#include "../engine/prepack.h"
#include "gemm_alpha.h"

#include <string.h>

static const dg_dtype kPackable[3] = {DG_BFLOAT16, DG_FLOAT8_E4M3, DG_FP4_E2M1X2};
static const dg_dtype kFp8Fp4[2] = {DG_FLOAT8_E4M3, DG_FP4_E2M1X2};

dg_status dg_pack_b(const dg_tensor *b, const dg_tensor *sfb, const dg_gemm_options *opts, dg_packed_b **out) {
    dg_api_begin("dg_pack_b");
    DG_CHECK(out != NULL, DG_ERR_NULL_POINTER, "argument 'out' is NULL");
    dg_operand ob;
    DG_TRY(dg_operand_init(&ob, "b", b, 0, kPackable, 3));
    return dg_packed_b_make(&ob, b, sfb, opts, dg_engine_prepack_b, out);
}

dg_status dg_packed_b_make(dg_operand *ob, const dg_tensor *b, const dg_tensor *sfb, const dg_gemm_options *opts,
                           dg_status (*pack)(const dg_operand *, struct dg_packed_b *), dg_packed_b **out) {
    int gran_a[2] = {0, 0}, gran_b[2] = {0, 0};
    /* The packed form holds every logical weight (at least 2 bytes each, plus per-group
     * padding), so a broadcast b (stride 0) claiming more than memory can hold is refused here,
     * before the engine sizes its buffers (found by tests/fuzz: G = 2^62 overflowed them, and
     * so did K = 2^63 - 1 with N = 0, rounding K up to even). */
    const int64_t groups = ob->groups > 0 ? ob->groups : 1;
    int64_t weights;
    DG_CHECK(groups <= (DG_MAX_SPAN_BYTES >> 10) && ob->mn <= (DG_MAX_SPAN_BYTES >> 2) &&
                 ob->k <= (DG_MAX_SPAN_BYTES >> 2) && dg_mul_ok(groups, ob->mn, &weights) &&
                 dg_mul_ok(weights, ob->k, &weights) && weights <= (DG_MAX_SPAN_BYTES >> 2),
             DG_ERR_OVERFLOW, "argument 'b': packing %lld x %lld x %lld weights needs more than 2^56 bytes",
             (long long)groups, (long long)ob->mn, (long long)ob->k);
    if (b->dtype == DG_BFLOAT16) {
        DG_CHECK(sfb == NULL, DG_ERR_VALUE, "argument 'sfb' must be NULL for a BF16 'b'");
    } else {
        DG_TRY(dg_resolve_recipe(opts, NULL, sfb, gran_a, gran_b));
        DG_TRY(dg_operand_set_scales(ob, "sfb", sfb, gran_b[0], gran_b[1]));
    }
    dg_packed_b *p = dg_malloc(sizeof *p);
    DG_CHECK(p != NULL, DG_ERR_ALLOC, "out of memory for a packed B");
    memset(p, 0, sizeof *p);
    p->dtype = b->dtype;
    p->sf_dtype = sfb ? sfb->dtype : DG_FLOAT32;
    p->gran_b[0] = gran_b[0], p->gran_b[1] = gran_b[1];
    const dg_status st = pack(ob, p);
    if (st != DG_OK) {
        dg_free(p);
        return st;
    }
    p->magic = DG_PACKED_B_MAGIC;
    *out = p;
    return DG_OK;
}

void dg_packed_b_free(dg_packed_b *p) {
    if (!p || p->magic != DG_PACKED_B_MAGIC)
        return;
    p->magic = 0;
    for (int64_t g = 0; g < p->groups; ++g) { /* grouped: each group's FP4 / FP8 copy (prepack.h) */
        dg_free(p->group[g].fp4_mem);
        dg_free(p->group[g].fp8_mem);
    }
    dg_free(p->fp4_mem);
    dg_free(p->fp8_mem);
    dg_engine_packed_free(&p->pk);
    dg_free(p);
}

/* ---- checks (as gemm_dense.c) ------------------------------------------------------------- */

static dg_status check_packed(const dg_packed_b *b) {
    DG_CHECK(b != NULL, DG_ERR_NULL_POINTER, "argument 'b' is NULL");
    DG_CHECK(b->magic == DG_PACKED_B_MAGIC, DG_ERR_VALUE, "argument 'b' is not a live dg_packed_b (freed?)");
    DG_CHECK(b->groups == 0, DG_ERR_VALUE,
             "argument 'b' holds %lld groups (dg_pack_b_grouped); use the m-grouped `_packed` GEMMs",
             (long long)b->groups);
    return DG_OK;
}

static dg_status check_out(const dg_operand *a, const dg_packed_b *b, const dg_tensor *d, const dg_tensor *c) {
    static const dg_dtype kOut[2] = {DG_BFLOAT16, DG_FLOAT32};
    DG_CHECK(a->k == b->k, DG_ERR_SHAPE, "arguments 'a' and 'b' disagree on K (%lld vs %lld)", (long long)a->k,
             (long long)b->k);
    DG_TRY(dg_check_tensor(d, "d", 2));
    DG_TRY(dg_check_dtype_in(d, "d", kOut, 2));
    DG_TRY(dg_check_dim(d, "d", 0, a->mn));
    DG_TRY(dg_check_dim(d, "d", 1, b->n));
    DG_TRY(dg_check_last_dim_contiguous(d, "d"));
    DG_TRY(dg_check_output(d, "d"));
    DG_TRY(dg_check_c_like_d(c, d));
    DG_TRY(dg_check_no_overlap(d, "d", a->data, "a", false));
    return dg_check_no_overlap(d, "d", a->sf, "sfa", false);
}

static dg_status run(const dg_operand *a, const dg_packed_b *b, const dg_tensor *d, const dg_tensor *c) {
    if (a->mn == 0 || b->n == 0)
        return DG_OK;
    DG_CHECK(!dg_use_reference(), DG_ERR_UNSUPPORTED,
             "pre-packed GEMMs run on the engine only; the reference backend is selected");
    return dg_engine_gemm_prepacked(a, b, d, c);
}

/* The product alone, for the alpha epilogue (gemm_alpha.h). */
typedef struct product_ctx {
    const dg_operand *a;
    const dg_packed_b *b;
} product_ctx;

static dg_status product(const void *ctx, const dg_tensor *out) {
    const product_ctx *p = ctx;
    return run(p->a, p->b, out, NULL);
}

/* ---- entry points ------------------------------------------------------------------------- */

dg_status dg_bf16_gemm_nt_packed(const dg_tensor *a, const dg_packed_b *b, const dg_tensor *d, const dg_tensor *c) {
    dg_api_begin("dg_bf16_gemm_nt_packed");
    static const dg_dtype kIn[1] = {DG_BFLOAT16};
    DG_TRY(check_packed(b));
    DG_CHECK(b->dtype == DG_BFLOAT16, DG_ERR_DTYPE,
             "argument 'b' was packed from %s; use dg_fp8_fp4_gemm_nt_packed", dg_dtype_name(b->dtype));
    dg_operand oa;
    DG_TRY(dg_operand_init(&oa, "a", a, 0, kIn, 1));
    DG_TRY(check_out(&oa, b, d, c));
    return run(&oa, b, d, c);
}

dg_status dg_fp8_fp4_gemm_nt_packed(const dg_tensor *a, const dg_tensor *sfa, const dg_packed_b *b,
                                    const dg_tensor *d, const dg_tensor *c, const dg_gemm_options *opts) {
    dg_api_begin("dg_fp8_fp4_gemm_nt_packed");
    DG_TRY(check_packed(b));
    DG_CHECK(b->dtype != DG_BFLOAT16, DG_ERR_DTYPE, "argument 'b' was packed from bfloat16; use dg_bf16_gemm_nt_packed");
    dg_operand oa;
    DG_TRY(dg_operand_init(&oa, "a", a, 0, kFp8Fp4, 2));
    dg_tensor sfb_like; /* the recipe default depends only on sfb's dtype */
    memset(&sfb_like, 0, sizeof sfb_like);
    sfb_like.dtype = b->sf_dtype;
    int gran_a[2], gran_b[2];
    DG_TRY(dg_check_alpha(opts, true));
    dg_gemm_options rest = opts ? *opts : dg_gemm_options_default();
    rest.has_alpha = 0; /* dg_resolve_recipe rejects alpha, which only the dense GEMMs take */
    DG_TRY(dg_resolve_recipe(&rest, sfa, &sfb_like, gran_a, gran_b));
    DG_CHECK(gran_b[0] == b->gran_b[0] && gran_b[1] == b->gran_b[1], DG_ERR_VALUE,
             "argument 'opts': the recipe gives B granularity (%d, %d), but 'b' was packed with (%d, %d)",
             gran_b[0], gran_b[1], b->gran_b[0], b->gran_b[1]);
    DG_TRY(dg_operand_set_scales(&oa, "sfa", sfa, gran_a[0], gran_a[1]));
    DG_TRY(check_out(&oa, b, d, c));
    if (!opts || !opts->has_alpha || oa.mn == 0 || b->n == 0 || b->k == 0) /* K = 0: D = C, as DeepGEMM */
        return run(&oa, b, d, c);
    const product_ctx ctx = {&oa, b};
    return dg_gemm_with_alpha(d, c, oa.mn, b->n, opts->alpha, product, &ctx);
}
