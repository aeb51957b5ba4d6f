/*
 * test_gemm_grouped_packed_bad.c - bad inputs to dg_pack_b_grouped and the m-grouped `_packed`
 * GEMMs: each fails with the expected status, its message names the argument, and D is bitwise
 * untouched (also when the failure is found late: masked_m contents, a psum layout with zero
 * padding, a packed B used under another ISA, scale blocks the packed engine refuses).
 */
#include "test_gemm_grouped_common.h"

#include "common/engine_variants.h"

#define EXPECT_FAIL(expr, want, arg, dt)                                                                   \
    do {                                                                                                   \
        void *snap_ = tu_snapshot(dt);                                                                     \
        TU_CHECK_STATUS(expr, want);                                                                       \
        TU_CHECK(strstr(dg_last_error(), arg) != NULL, "message '%s' should name %s", dg_last_error(), arg); \
        TU_CHECK(tu_unchanged(dt, snap_), "%s wrote D on failure", #expr);                                 \
        free(snap_);                                                                                       \
    } while (0)

enum { G = 3, MAXM = 8, N = 40, K = 256 };

static dg_tensor ints(int64_t n, const int32_t *v) {
    dg_tensor t = tu_alloc(DG_INT32, 1, (int64_t[]){n});
    memcpy(t.data, v, (size_t)n * 4);
    return t;
}

static void test_pack(tu_rng *r) {
    tq b16 = tq_make(r, TQ_BF16, 1, G, N, K, 1, 1), b8 = tq_make(r, TQ_FP8_F32, 1, G, N, K, 128, 128);
    tq b2d = tq_make(r, TQ_BF16, 0, 1, N, K, 1, 1);
    dg_packed_b *untouched = (dg_packed_b *)r, *out = untouched;
    TU_CHECK_STATUS(dg_pack_b_grouped(&b16.data, NULL, NULL, NULL), DG_ERR_NULL_POINTER);
    TU_CHECK(strstr(dg_last_error(), "'out'") != NULL, "names out: %s", dg_last_error());
    TU_CHECK_STATUS(dg_pack_b_grouped(NULL, NULL, NULL, &out), DG_ERR_NULL_POINTER);
    TU_CHECK(strstr(dg_last_error(), "'b'") != NULL, "names b: %s", dg_last_error());
    TU_CHECK(dg_pack_b_grouped(&b2d.data, NULL, NULL, &out) != DG_OK, "a 2-D b must be refused");
    TU_CHECK(strstr(dg_last_error(), "'b'") != NULL, "names b: %s", dg_last_error());
    TU_CHECK_STATUS(dg_pack_b_grouped(&b16.data, &b8.sf, NULL, &out), DG_ERR_VALUE);
    TU_CHECK(strstr(dg_last_error(), "'sfb'") != NULL, "names sfb: %s", dg_last_error());
    TU_CHECK_STATUS(dg_pack_b_grouped(&b8.data, NULL, NULL, &out), DG_ERR_NULL_POINTER);
    TU_CHECK(strstr(dg_last_error(), "'sfb'") != NULL, "names sfb: %s", dg_last_error());
    dg_tensor bad = b16.data;
    bad.dtype = DG_FLOAT32;
    TU_CHECK_STATUS(dg_pack_b_grouped(&bad, NULL, NULL, &out), DG_ERR_DTYPE);
    TU_CHECK(out == untouched, "dg_pack_b_grouped wrote *out on failure");
    tq_free(&b16), tq_free(&b8), tq_free(&b2d);
}

static void test_masked(tu_rng *r) {
    tq a16 = tq_make(r, TQ_BF16, 1, G, MAXM, K, 1, 1), b16 = tq_make(r, TQ_BF16, 1, G, N, K, 1, 1);
    tq a8 = tq_make(r, TQ_FP8_F32, 1, G, MAXM, K, 1, 128), b8 = tq_make(r, TQ_FP8_F32, 1, G, N, K, 128, 128);
    tq a4g = tq_make(r, TQ_BF16, 1, G + 1, MAXM, K, 1, 1), ak = tq_make(r, TQ_BF16, 1, G, MAXM, K - 32, 1, 1);
    tq b2d = tq_make(r, TQ_BF16, 0, 1, N, K, 1, 1);
    dg_packed_b *p16 = NULL, *p8 = NULL, *dense = NULL;
    TU_CHECK_OK(dg_pack_b_grouped(&b16.data, NULL, NULL, &p16));
    TU_CHECK_OK(dg_pack_b_grouped(&b8.data, &b8.sf, NULL, &p8));
    TU_CHECK_OK(dg_pack_b(&b2d.data, NULL, NULL, &dense));
    dg_tensor d = tu_alloc3(DG_BFLOAT16, G, MAXM, N), dn = tu_alloc3(DG_BFLOAT16, G, MAXM, N + 1);
    tu_fill_bytes(&d, 0xA5), tu_fill_bytes(&dn, 0xA5);
    const int32_t ok_m[G] = {3, 0, 8}, big_m[G] = {3, 9, 8}, neg_m[G] = {3, 1, -1};
    dg_tensor mm = ints(G, ok_m), mbig = ints(G, big_m), mneg = ints(G, neg_m);
    const dg_gemm_options o = dg_gemm_options_default();

    EXPECT_FAIL(dg_m_grouped_bf16_gemm_nt_masked_packed(NULL, p16, &d, &mm, 4, &o), DG_ERR_NULL_POINTER, "'a'", &d);
    EXPECT_FAIL(dg_m_grouped_bf16_gemm_nt_masked_packed(&a16.data, NULL, &d, &mm, 4, &o), DG_ERR_NULL_POINTER, "'b'",
                &d);
    EXPECT_FAIL(dg_m_grouped_bf16_gemm_nt_masked_packed(&a16.data, p16, NULL, &mm, 4, &o), DG_ERR_NULL_POINTER,
                "'d'", &d);
    EXPECT_FAIL(dg_m_grouped_bf16_gemm_nt_masked_packed(&a16.data, p16, &d, NULL, 4, &o), DG_ERR_NULL_POINTER,
                "'masked_m'", &d);
    EXPECT_FAIL(dg_m_grouped_bf16_gemm_nt_masked_packed(&a16.data, dense, &d, &mm, 4, &o), DG_ERR_VALUE,
                "dg_pack_b_grouped", &d);
    EXPECT_FAIL(dg_m_grouped_bf16_gemm_nt_masked_packed(&a4g.data, p16, &d, &mm, 4, &o), DG_ERR_SHAPE, "'b'", &d);
    EXPECT_FAIL(dg_m_grouped_bf16_gemm_nt_masked_packed(&ak.data, p16, &d, &mm, 4, &o), DG_ERR_SHAPE, "'b'", &d);
    EXPECT_FAIL(dg_m_grouped_bf16_gemm_nt_masked_packed(&a16.data, p16, &dn, &mm, 4, &o), DG_ERR_SHAPE, "'d'", &dn);
    EXPECT_FAIL(dg_m_grouped_bf16_gemm_nt_masked_packed(&a16.data, p16, &d, &mbig, 4, &o), DG_ERR_VALUE,
                "'masked_m': entry 1", &d);
    EXPECT_FAIL(dg_m_grouped_bf16_gemm_nt_masked_packed(&a16.data, p16, &d, &mneg, 4, &o), DG_ERR_VALUE,
                "'masked_m': entry 2", &d);
    EXPECT_FAIL(dg_m_grouped_bf16_gemm_nt_masked_packed(&a16.data, p16, &d, &mm, 0, &o), DG_ERR_VALUE,
                "'expected_m'", &d);
    {
        dg_gemm_options op = o; /* masked forms take no psum layout */
        op.use_psum_layout = 1;
        EXPECT_FAIL(dg_m_grouped_bf16_gemm_nt_masked_packed(&a16.data, p16, &d, &mm, 4, &op), DG_ERR_VALUE,
                    "'use_psum_layout'", &d);
        op = o, op.expected_m_for_psum_layout = 8;
        EXPECT_FAIL(dg_m_grouped_bf16_gemm_nt_masked_packed(&a16.data, p16, &d, &mm, 4, &op), DG_ERR_VALUE,
                    "'expected_m_for_psum_layout'", &d);
    }
    EXPECT_FAIL(dg_m_grouped_bf16_gemm_nt_masked_packed(&a16.data, p8, &d, &mm, 4, &o), DG_ERR_DTYPE, "'b'", &d);
    EXPECT_FAIL(dg_m_grouped_bf16_gemm_nt_masked_packed(&a8.data, p16, &d, &mm, 4, &o), DG_ERR_DTYPE, "'a'", &d);
    EXPECT_FAIL(dg_m_grouped_fp8_fp4_gemm_nt_masked_packed(&a8.data, NULL, p8, &d, &mm, 4, &o), DG_ERR_NULL_POINTER,
                "'sfa'", &d);
    EXPECT_FAIL(dg_m_grouped_fp8_fp4_gemm_nt_masked_packed(&a8.data, &a8.sf, p16, &d, &mm, 4, &o), DG_ERR_DTYPE,
                "'b'", &d);
    dg_gemm_options o11 = o; /* B packed at (128, 128); the call says (1, 128) */
    o11.recipe_a[0] = 1, o11.recipe_a[1] = 128, o11.recipe_b[0] = 1, o11.recipe_b[1] = 128;
    EXPECT_FAIL(dg_m_grouped_fp8_fp4_gemm_nt_masked_packed(&a8.data, &a8.sf, p8, &d, &mm, 4, &o11), DG_ERR_VALUE,
                "'opts'", &d);
    TU_CHECK_OK(dg_m_grouped_fp8_fp4_gemm_nt_masked_packed(&a8.data, &a8.sf, p8, &d, &mm, 4, NULL));
    tu_fill_bytes(&d, 0xA5);

    TU_CHECK_OK(dg_set_backend(DG_BACKEND_REFERENCE));
    EXPECT_FAIL(dg_m_grouped_bf16_gemm_nt_masked_packed(&a16.data, p16, &d, &mm, 4, &o), DG_ERR_UNSUPPORTED,
                "reference", &d);
    TU_CHECK_OK(dg_set_backend(DG_BACKEND_AUTO));
    const dg_isa best = dg_get_isa();
    if (best != DG_ISA_GENERIC) { /* packed under another kernel */
        TU_CHECK_OK(dg_set_isa(DG_ISA_GENERIC));
        EXPECT_FAIL(dg_m_grouped_bf16_gemm_nt_masked_packed(&a16.data, p16, &d, &mm, 4, &o), DG_ERR_VALUE,
                    "dg_set_isa", &d);
        TU_CHECK_OK(dg_set_isa(best));
    }
    if (best == DG_ISA_AMX) { /* A's scale blocks of 16 are no whole AMX k steps: not refused, the */
        /* call runs the fallback level on B's kept FP8 codes, bitwise the unpacked call */
        tq a16k = tq_make(r, TQ_FP8_F32, 1, G, MAXM, K, 1, 16);
        dg_gemm_options o16 = o;
        o16.recipe_a[0] = 1, o16.recipe_a[1] = 16, o16.recipe_b[0] = 128, o16.recipe_b[1] = 128;
        dg_tensor d2 = tu_alloc3(DG_BFLOAT16, G, MAXM, N);
        tu_fill_bytes(&d, 0xA5), tu_fill_bytes(&d2, 0xA5);
        TU_CHECK_OK(dg_m_grouped_fp8_fp4_gemm_nt_masked_packed(&a16k.data, &a16k.sf, p8, &d, &mm, 4, &o16));
        TU_CHECK_OK(dg_m_grouped_fp8_fp4_gemm_nt_masked(&a16k.data, &a16k.sf, &b8.data, &b8.sf, &d2, &mm, 4, &o16));
        TU_CHECK(memcmp(d.data, d2.data, (size_t)(G * MAXM * N) * 2) == 0,
                 "A's scale blocks of 16 on an AMX-packed B: bitwise the unpacked call");
        tu_free(&d2);
        tq_free(&a16k);
    }
    dg_packed_b_free(p16), dg_packed_b_free(p8), dg_packed_b_free(dense);
    tu_free(&d), tu_free(&dn), tu_free(&mm), tu_free(&mbig), tu_free(&mneg);
    tq_free(&a16), tq_free(&b16), tq_free(&a8), tq_free(&b8), tq_free(&a4g), tq_free(&ak), tq_free(&b2d);
}

static void test_contiguous(tu_rng *r) {
    enum { M = 40 };
    tq a = tq_make(r, TQ_BF16, 0, 1, M, K, 1, 1), b = tq_make(r, TQ_BF16, 1, G, N, K, 1, 1);
    dg_packed_b *p = NULL;
    TU_CHECK_OK(dg_pack_b_grouped(&b.data, NULL, NULL, &p));
    dg_tensor d = tu_alloc2(DG_FLOAT32, M, N), dn = tu_alloc2(DG_FLOAT32, M, N - 1);
    tu_fill_bytes(&d, 0xA5), tu_fill_bytes(&dn, 0xA5);
    int32_t idx[M];
    for (int i = 0; i < M; ++i)
        idx[i] = i % 4 == 3 ? -1 : i % 3;
    dg_tensor gl = ints(M, idx);
    idx[M - 1] = G; /* found last: nothing may be written before it */
    dg_tensor glbad = ints(M, idx);
    const int32_t ends_bad[G] = {5, 3, 40}; /* group 1 ends before its start (16 with alignment 16) */
    dg_tensor ps = ints(G, ends_bad);
    const int align = dg_get_mk_alignment_for_contiguous_layout();
    TU_CHECK_OK(dg_set_mk_alignment_for_contiguous_layout(16));
    dg_gemm_options o = dg_gemm_options_default(), op = o;
    op.use_psum_layout = 1; /* with ensure_zero_padding: still nothing written on error */

    EXPECT_FAIL(dg_m_grouped_bf16_gemm_nt_contiguous_packed(&a.data, p, &d, &glbad, &o), DG_ERR_VALUE,
                "'grouped_layout': entry 39", &d);
    EXPECT_FAIL(dg_m_grouped_bf16_gemm_nt_contiguous_packed(&a.data, p, &d, &ps, &op), DG_ERR_VALUE,
                "'grouped_layout': entry 1", &d);
    EXPECT_FAIL(dg_m_grouped_bf16_gemm_nt_contiguous_packed(&a.data, p, &dn, &gl, &o), DG_ERR_SHAPE, "'d'", &dn);
    EXPECT_FAIL(dg_m_grouped_bf16_gemm_nt_contiguous_packed(&a.data, p, &d, NULL, &o), DG_ERR_NULL_POINTER,
                "'grouped_layout'", &d);
    EXPECT_FAIL(dg_m_grouped_bf16_gemm_nt_contiguous_packed(&a.data, NULL, &d, &gl, &o), DG_ERR_NULL_POINTER, "'b'",
                &d);
    EXPECT_FAIL(dg_m_grouped_fp8_fp4_gemm_nt_contiguous_packed(&a.data, NULL, p, &d, &gl, &o), DG_ERR_DTYPE, "'b'",
                &d);
    dg_gemm_options orec = o;
    orec.recipe[0] = 1, orec.recipe[1] = 128, orec.recipe[2] = 128;
    EXPECT_FAIL(dg_m_grouped_bf16_gemm_nt_contiguous_packed(&a.data, p, &d, &gl, &orec), DG_ERR_VALUE, "recipe", &d);
    TU_CHECK_OK(dg_m_grouped_bf16_gemm_nt_contiguous_packed(&a.data, p, &d, &gl, &o));
    TU_CHECK_OK(dg_set_mk_alignment_for_contiguous_layout(align));
    dg_packed_b_free(p);
    tu_free(&d), tu_free(&dn), tu_free(&gl), tu_free(&glbad), tu_free(&ps);
    tq_free(&a), tq_free(&b);
}

int main(void) {
    tu_rng r = {0xbad5};
    test_pack(&r);
    test_masked(&r);
    test_contiguous(&r);
    return tu_finish();
}
