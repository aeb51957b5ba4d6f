/*
 * gemm_grouped_packed.c - m-grouped GEMMs on grouped weights packed once (dg_pack_b_grouped):
 * masked (decoding) and contiguous (index or psum layout), BF16 and FP8/FP4. Every check of the
 * unpacked m-grouped calls (gemm_m_grouped.c) applies, with B's group count, N, K, dtype,
 * recipe and ISA taken from the packed object; nothing is written on error. D is bitwise the
 * unpacked call's on the same inputs. Engine side: src/engine/grouped_packed.c.
 */
#include "core/internal.h"
#include "core/operand.h"
#include "engine/grouped.h"
#include "engine/prepack.h"
#include "gemm_grouped_checks.h"

#include <string.h>

static const dg_dtype kPackable[3] = {DG_BFLOAT16, DG_FLOAT8_E4M3, DG_FP4_E2M1X2};

dg_status dg_pack_b_grouped(const dg_tensor *b, const dg_tensor *sfb, const dg_gemm_options *opts,
                            dg_packed_b **out) {
    dg_api_begin("dg_pack_b_grouped");
    DG_CHECK(out != NULL, DG_ERR_NULL_POINTER, "argument 'out' is NULL");
    dg_operand ob;
    DG_TRY(dg_operand_init(&ob, "b", b, 1, kPackable, 3));
    DG_CHECK(ob.groups > 0 && ob.mn > 0 && ob.k > 0, DG_ERR_SHAPE,
             "argument 'b': N, K and the number of groups must be positive (got G=%lld, N=%lld, K=%lld)",
             (long long)ob.groups, (long long)ob.mn, (long long)ob.k);
    return dg_packed_b_make(&ob, b, sfb, opts, dg_engine_prepack_b_grouped, out);
}

/* ---- checks ---------------------------------------------------------------------------------- */

static dg_status check_packed(const dg_packed_b *b, bool quantized, const char *other) {
    DG_CHECK(b != NULL, DG_ERR_NULL_POINTER, "argument 'b' is NULL");
    DG_CHECK(b->magic == DG_PACKED_B_MAGIC, DG_ERR_VALUE, "argument 'b' is not a live dg_packed_b (freed?)");
    DG_CHECK(b->groups > 0, DG_ERR_VALUE,
             "argument 'b' is a dense packed B (dg_pack_b); m-grouped GEMMs take one from dg_pack_b_grouped");
    DG_CHECK((b->dtype != DG_BFLOAT16) == quantized, DG_ERR_DTYPE, "argument 'b' was packed from %s; use %s",
             dg_dtype_name(b->dtype), other);
    return DG_OK;
}

/* A (grouped for the masked form) with its scales at the recipe the packed B was packed with. */
static dg_status packed_a(const dg_tensor *a, const dg_tensor *sfa, const dg_packed_b *b, int grouped,
                          const dg_gemm_options *o, bool quantized, dg_operand *A) {
    int ga[2], gb[2];
    if (quantized) {
        dg_tensor sfb_like; /* the recipe default depends only on sfb's dtype */
        memset(&sfb_like, 0, sizeof sfb_like);
        sfb_like.dtype = b->sf_dtype;
        DG_TRY(dg_resolve_recipe(o, sfa, &sfb_like, ga, gb));
        DG_CHECK(gb[0] == b->gran_b[0] && gb[1] == b->gran_b[1], DG_ERR_VALUE,
                 "argument 'opts': the recipe gives B granularity (%d, %d), but 'b' was packed with (%d, %d)",
                 gb[0], gb[1], b->gran_b[0], b->gran_b[1]);
    } else {
        DG_TRY(resolve_granularity(o, false, sfa, NULL, ga, gb));
    }
    DG_TRY(dg_operand_init(A, "a", a, grouped, quantized ? kFp8Fp4Types : kBf16Types, quantized ? 2 : 1));
    DG_TRY(check_k_major(A, "a"));
    DG_CHECK(A->k == b->k, DG_ERR_SHAPE, "arguments 'a' and 'b' disagree on K (%lld vs %lld)", (long long)A->k,
             (long long)b->k);
    return dg_operand_set_scales(A, "sfa", sfa, ga[0], ga[1]);
}

static dg_status engine_only(void) {
    DG_CHECK(!dg_use_reference(), DG_ERR_UNSUPPORTED,
             "pre-packed GEMMs run on the engine only; the reference backend is selected");
    return DG_OK;
}

/* ---- bodies ---------------------------------------------------------------------------------- */

static dg_status masked_packed(const dg_tensor *a, const dg_tensor *sfa, const dg_packed_b *b, const dg_tensor *d,
                               const dg_tensor *masked_m, int expected_m, const dg_gemm_options *opts,
                               bool quantized, const char *other) {
    const dg_gemm_options def = dg_gemm_options_default();
    const dg_gemm_options *o = opts ? opts : &def;
    DG_TRY(check_masked_options(o));
    DG_TRY(check_packed(b, quantized, other));
    dg_operand A;
    DG_TRY(packed_a(a, sfa, b, 1, o, quantized, &A));
    DG_CHECK(A.groups == b->groups, DG_ERR_SHAPE, "argument 'a' has %lld groups but 'b' was packed with %lld",
             (long long)A.groups, (long long)b->groups);
    DG_CHECK(A.mn > 0 && A.k > 0, DG_ERR_SHAPE, "argument 'a': max_m and K must be positive (got max_m=%lld, K=%lld)",
             (long long)A.mn, (long long)A.k);
    DG_TRY(check_expected_m(expected_m));
    DG_TRY(check_d(d, 3));
    DG_TRY(dg_check_dim(d, "d", 0, A.groups));
    DG_TRY(dg_check_dim(d, "d", 1, A.mn));
    DG_TRY(dg_check_dim(d, "d", 2, b->n));
    DG_TRY(check_index_tensor(masked_m, "masked_m", A.groups));
    DG_TRY(check_d_disjoint(d, a, sfa, NULL, NULL, masked_m, "masked_m"));
    const int32_t *mm = (const int32_t *)masked_m->data;
    DG_TRY(check_masked_m_values(mm, A.groups, A.mn));
    DG_TRY(engine_only());
    return dg_engine_m_grouped_masked_prepacked(&A, b, d, mm);
}

static dg_status contiguous_packed(const dg_tensor *a, const dg_tensor *sfa, const dg_packed_b *b,
                                   const dg_tensor *d, const dg_tensor *gl, const dg_gemm_options *opts,
                                   bool quantized, const char *other) {
    const dg_gemm_options def = dg_gemm_options_default();
    const dg_gemm_options *o = opts ? opts : &def;
    DG_TRY(check_packed(b, quantized, other));
    dg_operand A;
    DG_TRY(packed_a(a, sfa, b, 0, o, quantized, &A));
    DG_TRY(check_d(d, 2));
    DG_TRY(dg_check_dim(d, "d", 0, A.mn));
    DG_TRY(dg_check_dim(d, "d", 1, b->n));
    const bool psum = o->use_psum_layout != 0;
    DG_TRY(check_index_tensor(gl, "grouped_layout", psum ? b->groups : A.mn));
    DG_TRY(check_expected_m_for_psum(o, psum));
    DG_TRY(check_d_disjoint(d, a, sfa, NULL, NULL, gl, "grouped_layout"));
    const int64_t alignment = dg_get_mk_alignment_for_contiguous_layout();
    const int32_t *layout = (const int32_t *)gl->data;
    if (psum)
        DG_TRY(check_psum_layout(layout, A.mn, b->groups, alignment));
    else
        DG_TRY(check_index_layout(layout, A.mn, b->groups));
    if (A.mn == 0)
        return DG_OK;
    DG_TRY(engine_only());
    return dg_engine_m_grouped_contiguous_prepacked(&A, b, d, layout, psum, alignment, o->ensure_zero_padding != 0);
}

/* ---- entry points ---------------------------------------------------------------------------- */

dg_status dg_m_grouped_bf16_gemm_nt_masked_packed(const dg_tensor *a, const dg_packed_b *b, const dg_tensor *d,
                                                  const dg_tensor *masked_m, int expected_m,
                                                  const dg_gemm_options *opts) {
    dg_api_begin("dg_m_grouped_bf16_gemm_nt_masked_packed");
    return masked_packed(a, NULL, b, d, masked_m, expected_m, opts, false,
                         "dg_m_grouped_fp8_fp4_gemm_nt_masked_packed");
}

dg_status dg_m_grouped_fp8_fp4_gemm_nt_masked_packed(const dg_tensor *a, const dg_tensor *sfa,
                                                     const dg_packed_b *b, const dg_tensor *d,
                                                     const dg_tensor *masked_m, int expected_m,
                                                     const dg_gemm_options *opts) {
    dg_api_begin("dg_m_grouped_fp8_fp4_gemm_nt_masked_packed");
    return masked_packed(a, sfa, b, d, masked_m, expected_m, opts, true, "dg_m_grouped_bf16_gemm_nt_masked_packed");
}

dg_status dg_m_grouped_bf16_gemm_nt_contiguous_packed(const dg_tensor *a, const dg_packed_b *b, const dg_tensor *d,
                                                      const dg_tensor *grouped_layout,
                                                      const dg_gemm_options *opts) {
    dg_api_begin("dg_m_grouped_bf16_gemm_nt_contiguous_packed");
    return contiguous_packed(a, NULL, b, d, grouped_layout, opts, false,
                             "dg_m_grouped_fp8_fp4_gemm_nt_contiguous_packed");
}

dg_status dg_m_grouped_fp8_fp4_gemm_nt_contiguous_packed(const dg_tensor *a, const dg_tensor *sfa,
                                                         const dg_packed_b *b, const dg_tensor *d,
                                                         const dg_tensor *grouped_layout,
                                                         const dg_gemm_options *opts) {
    dg_api_begin("dg_m_grouped_fp8_fp4_gemm_nt_contiguous_packed");
    return contiguous_packed(a, sfa, b, d, grouped_layout, opts, true,
                             "dg_m_grouped_bf16_gemm_nt_contiguous_packed");
}
