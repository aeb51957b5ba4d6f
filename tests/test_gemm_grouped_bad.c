/*
 * test_gemm_grouped_bad.c - bad arguments to every grouped GEMM entry point: each returns the
 * expected status, names the argument in its message, and leaves D bitwise untouched.
 */
#include "test_gemm_grouped_common.h"

static void expect(dg_status got, dg_status want, const char *needle, const dg_tensor *watch, const void *snap,
                   int line) {
    tu_check_impl(got == want, __FILE__, line, "status", "got %s, want %s (%s)", dg_status_string(got),
                  dg_status_string(want), dg_last_error());
    tu_check_impl(strstr(dg_last_error(), needle) != NULL, __FILE__, line, "message", "'%s' does not mention '%s'",
                  dg_last_error(), needle);
    tu_check_impl(tu_unchanged(watch, snap), __FILE__, line, "untouched", "the output was written");
}
#define EXPECT(call, want, needle) expect((call), (want), (needle), &d, snap, __LINE__)

static dg_tensor i32(int n, const int *v) {
    dg_tensor t = tu_alloc(DG_INT32, 1, (int64_t[]){n});
    memcpy(t.data, v, (size_t)n * sizeof(int));
    return t;
}

static void set_i32(dg_tensor *t, const int *v) { memcpy(t->data, v, (size_t)t->shape[0] * sizeof(int)); }

static void test_m_contiguous(tu_rng *rng) {
    tq A = tq_make(rng, TQ_FP8_F32, 0, 1, 16, 128, 1, 128), B = tq_make(rng, TQ_FP8_F32, 1, 2, 64, 128, 128, 128);
    tq Ab = tq_make(rng, TQ_BF16, 0, 1, 16, 128, 1, 1), Bb = tq_make(rng, TQ_BF16, 1, 2, 64, 128, 1, 1);
    int idx[16];
    for (int r = 0; r < 16; ++r)
        idx[r] = r < 6 ? 0 : (r < 8 ? -1 : 1);
    dg_tensor gl = i32(16, idx), d = tu_alloc2(DG_BFLOAT16, 16, 64);
    tu_fill_bytes(&d, 0xA5);
    void *snap = tu_snapshot(&d);
    const dg_tensor *a = &A.data, *sfa = &A.sf, *b = &B.data, *sfb = &B.sf;
    /* `_nn` operands: [G, K, N] views of the same memory */
    const dg_tensor bnn = dg_tensor_transpose(B.data, 1, 2), sfbnn = dg_tensor_transpose(B.sf, 1, 2);
    const dg_tensor bbnn = dg_tensor_transpose(Bb.data, 1, 2);
    TU_CHECK_OK(dg_m_grouped_fp8_fp4_gemm_nt_contiguous(a, sfa, b, sfb, &d, &gl, NULL));
    TU_CHECK_OK(dg_m_grouped_fp8_fp4_gemm_nn_contiguous(a, sfa, &bnn, &sfbnn, &d, &gl, NULL));
    TU_CHECK_OK(dg_m_grouped_bf16_gemm_nn_contiguous(&Ab.data, &bbnn, &d, &gl, NULL));
    tu_fill_bytes(&d, 0xA5);

    EXPECT(dg_m_grouped_fp8_fp4_gemm_nt_contiguous(NULL, sfa, b, sfb, &d, &gl, NULL), DG_ERR_NULL_POINTER, "'a'");
    EXPECT(dg_m_grouped_fp8_fp4_gemm_nt_contiguous(a, NULL, b, sfb, &d, &gl, NULL), DG_ERR_NULL_POINTER, "sfa");
    EXPECT(dg_m_grouped_fp8_fp4_gemm_nt_contiguous(a, sfa, b, NULL, &d, &gl, NULL), DG_ERR_NULL_POINTER, "sfb");
    EXPECT(dg_m_grouped_fp8_fp4_gemm_nt_contiguous(a, sfa, b, sfb, NULL, &gl, NULL), DG_ERR_NULL_POINTER, "'d'");
    EXPECT(dg_m_grouped_fp8_fp4_gemm_nt_contiguous(a, sfa, b, sfb, &d, NULL, NULL), DG_ERR_NULL_POINTER,
           "grouped_layout");
    EXPECT(dg_m_grouped_fp8_fp4_gemm_nt_contiguous(&Ab.data, sfa, b, sfb, &d, &gl, NULL), DG_ERR_DTYPE, "'a'");
    EXPECT(dg_m_grouped_fp8_fp4_gemm_nt_contiguous(a, sfa, a, sfb, &d, &gl, NULL), DG_ERR_SHAPE, "'b'");
    dg_tensor bk = *b;
    bk.shape[2] = 64;
    EXPECT(dg_m_grouped_fp8_fp4_gemm_nt_contiguous(a, sfa, &bk, sfb, &d, &gl, NULL), DG_ERR_SHAPE, "'b'");
    dg_tensor bn = *b;
    bn.shape[1] = 0;
    EXPECT(dg_m_grouped_fp8_fp4_gemm_nt_contiguous(a, sfa, &bn, sfb, &d, &gl, NULL), DG_ERR_SHAPE, "'b'");
    dg_tensor sfbx = *sfb;
    sfbx.shape[2] = 2;
    EXPECT(dg_m_grouped_fp8_fp4_gemm_nt_contiguous(a, sfa, b, &sfbx, &d, &gl, NULL), DG_ERR_SHAPE, "sfb");
    dg_tensor at = dg_tensor_transpose(dg_tensor_2d(A.data.data, DG_FLOAT8_E4M3, 128, 16), 0, 1);
    EXPECT(dg_m_grouped_fp8_fp4_gemm_nt_contiguous(&at, sfa, b, sfb, &d, &gl, NULL), DG_ERR_LAYOUT, "'a'");
    dg_tensor dm = d;
    dm.shape[0] = 15;
    EXPECT(dg_m_grouped_fp8_fp4_gemm_nt_contiguous(a, sfa, b, sfb, &dm, &gl, NULL), DG_ERR_SHAPE, "'d'");
    dg_tensor df = d;
    df.dtype = DG_FLOAT8_E4M3;
    EXPECT(dg_m_grouped_fp8_fp4_gemm_nt_contiguous(a, sfa, b, sfb, &df, &gl, NULL), DG_ERR_DTYPE, "'d'");
    dg_tensor ds = dg_tensor_transpose(dg_tensor_2d(d.data, DG_BFLOAT16, 64, 16), 0, 1);
    EXPECT(dg_m_grouped_fp8_fp4_gemm_nt_contiguous(a, sfa, b, sfb, &ds, &gl, NULL), DG_ERR_LAYOUT, "'d'");
    {   /* d overlapping an input */
        dg_tensor over = dg_tensor_2d(Bb.data.data, DG_BFLOAT16, 16, 64);
        void *s2 = tu_snapshot(&over);
        expect(dg_m_grouped_bf16_gemm_nt_contiguous(&Ab.data, &Bb.data, &over, &gl, NULL), DG_ERR_LAYOUT, "'b'",
               &over, s2, __LINE__);
        free(s2);
    }
    dg_tensor gl64 = gl;
    gl64.dtype = DG_INT64;
    gl64.shape[0] = 8;
    EXPECT(dg_m_grouped_fp8_fp4_gemm_nt_contiguous(a, sfa, b, sfb, &d, &gl64, NULL), DG_ERR_DTYPE, "grouped_layout");
    dg_tensor glshort = gl;
    glshort.shape[0] = 15;
    EXPECT(dg_m_grouped_fp8_fp4_gemm_nt_contiguous(a, sfa, b, sfb, &d, &glshort, NULL), DG_ERR_SHAPE,
           "grouped_layout");
    idx[3] = 2;
    set_i32(&gl, idx);
    EXPECT(dg_m_grouped_fp8_fp4_gemm_nt_contiguous(a, sfa, b, sfb, &d, &gl, NULL), DG_ERR_VALUE,
           "'grouped_layout': entry 3");
    EXPECT(dg_m_grouped_bf16_gemm_nt_contiguous(&Ab.data, &Bb.data, &d, &gl, NULL), DG_ERR_VALUE,
           "'grouped_layout': entry 3");
    idx[3] = -2;
    set_i32(&gl, idx);
    EXPECT(dg_m_grouped_fp8_fp4_gemm_nn_contiguous(a, sfa, &bnn, &sfbnn, &d, &gl, NULL), DG_ERR_VALUE,
           "'grouped_layout': entry 3");
    idx[3] = 0;
    set_i32(&gl, idx);

    dg_gemm_options o = dg_gemm_options_default();
    o.expected_m_for_psum_layout = 8;
    EXPECT(dg_m_grouped_fp8_fp4_gemm_nt_contiguous(a, sfa, b, sfb, &d, &gl, &o), DG_ERR_VALUE,
           "'expected_m_for_psum_layout'");
    o = dg_gemm_options_default();
    o.recipe[0] = 1, o.recipe[1] = 128, o.recipe[2] = 128, o.recipe_a[0] = 1, o.recipe_a[1] = 128;
    o.recipe_b[0] = 128, o.recipe_b[1] = 128;
    EXPECT(dg_m_grouped_fp8_fp4_gemm_nt_contiguous(a, sfa, b, sfb, &d, &gl, &o), DG_ERR_VALUE, "'recipe'");
    EXPECT(dg_m_grouped_bf16_gemm_nt_contiguous(&Ab.data, &Bb.data, &d, &gl, &o), DG_ERR_VALUE, "'recipe'");
    o = dg_gemm_options_default();
    o.recipe_a[0] = 1, o.recipe_a[1] = 128;
    EXPECT(dg_m_grouped_fp8_fp4_gemm_nt_contiguous(a, sfa, b, sfb, &d, &gl, &o), DG_ERR_VALUE, "'recipe_a'");
    o = dg_gemm_options_default();
    o.recipe[0] = -1, o.recipe[1] = 128, o.recipe[2] = 128;
    EXPECT(dg_m_grouped_fp8_fp4_gemm_nt_contiguous(a, sfa, b, sfb, &d, &gl, &o), DG_ERR_VALUE, "'recipe'");
    EXPECT(dg_m_grouped_bf16_gemm_nt_contiguous(a, b, &d, &gl, NULL), DG_ERR_DTYPE, "'a'");
    EXPECT(dg_m_grouped_bf16_gemm_nn_contiguous(&Ab.data, &Ab.data, &d, &gl, NULL), DG_ERR_SHAPE, "'b'");
    EXPECT(dg_m_grouped_fp8_fp4_gemm_nn_contiguous(a, sfa, &bnn, NULL, &d, &gl, NULL), DG_ERR_NULL_POINTER, "sfb");
    EXPECT(dg_m_grouped_fp8_gemm_nt_contiguous(NULL, sfa, b, sfb, &d, &gl, NULL), DG_ERR_NULL_POINTER, "'a'");
    EXPECT(dg_m_grouped_fp8_gemm_nn_contiguous(a, sfa, &bnn, &sfbnn, &d, &glshort, NULL), DG_ERR_SHAPE,
           "grouped_layout");

    /* psum layout: [G] end rows, alignment 8. */
    TU_CHECK_OK(dg_set_mk_alignment_for_contiguous_layout(8));
    o = dg_gemm_options_default();
    o.use_psum_layout = 1;
    dg_tensor ps = i32(2, (int[]){6, 13});
    TU_CHECK_OK(dg_m_grouped_bf16_gemm_nt_contiguous(&Ab.data, &Bb.data, &d, &ps, &o));
    tu_fill_bytes(&d, 0xA5);
    EXPECT(dg_m_grouped_bf16_gemm_nt_contiguous(&Ab.data, &Bb.data, &d, &gl, &o), DG_ERR_SHAPE, "grouped_layout");
    set_i32(&ps, (int[]){10, 5});
    EXPECT(dg_m_grouped_bf16_gemm_nt_contiguous(&Ab.data, &Bb.data, &d, &ps, &o), DG_ERR_VALUE,
           "'grouped_layout': entry 1");
    set_i32(&ps, (int[]){3, 5}); /* group 1 starts at align(3, 8) = 8 */
    EXPECT(dg_m_grouped_fp8_fp4_gemm_nt_contiguous(a, sfa, b, sfb, &d, &ps, &o), DG_ERR_VALUE,
           "'grouped_layout': entry 1");
    set_i32(&ps, (int[]){8, 17});
    EXPECT(dg_m_grouped_bf16_gemm_nn_contiguous(&Ab.data, &bbnn, &d, &ps, &o), DG_ERR_VALUE,
           "'grouped_layout': entry 1");
    set_i32(&ps, (int[]){-1, 4});
    EXPECT(dg_m_grouped_fp8_gemm_nt_contiguous(a, sfa, b, sfb, &d, &ps, &o), DG_ERR_VALUE, "'grouped_layout': entry 0");
    TU_CHECK_OK(dg_set_mk_alignment_for_contiguous_layout(128));

    free(snap);
    tu_free(&ps);
    tu_free(&gl);
    tu_free(&d);
    tq_free(&A);
    tq_free(&B);
    tq_free(&Ab);
    tq_free(&Bb);
}

static void test_masked(tu_rng *rng) {
    tq A = tq_make(rng, TQ_BF16, 1, 2, 8, 64, 1, 1), B = tq_make(rng, TQ_BF16, 1, 2, 32, 64, 1, 1);
    tq Aq = tq_make(rng, TQ_FP8_UE8M0, 1, 2, 8, 256, 1, 128), Bq = tq_make(rng, TQ_FP8_UE8M0, 1, 2, 32, 256, 1, 128);
    dg_tensor mm = i32(2, (int[]){8, 3}), d = tu_alloc3(DG_BFLOAT16, 2, 8, 32);
    tu_fill_bytes(&d, 0xA5);
    void *snap = tu_snapshot(&d);
    const dg_tensor *a = &A.data, *b = &B.data;
    TU_CHECK_OK(dg_m_grouped_bf16_gemm_nt_masked(a, b, &d, &mm, 4, NULL));
    TU_CHECK_OK(dg_m_grouped_fp8_fp4_gemm_nt_masked(&Aq.data, &Aq.sf, &Bq.data, &Bq.sf, &d, &mm, 4, NULL));
    tu_fill_bytes(&d, 0xA5);

    set_i32(&mm, (int[]){8, 9});
    EXPECT(dg_m_grouped_bf16_gemm_nt_masked(a, b, &d, &mm, 4, NULL), DG_ERR_VALUE, "'masked_m': entry 1");
    EXPECT(dg_m_grouped_fp8_gemm_nt_masked(&Aq.data, &Aq.sf, &Bq.data, &Bq.sf, &d, &mm, 4, NULL), DG_ERR_VALUE,
           "'masked_m': entry 1");
    set_i32(&mm, (int[]){-1, 2});
    EXPECT(dg_m_grouped_fp8_fp4_gemm_nt_masked(&Aq.data, &Aq.sf, &Bq.data, &Bq.sf, &d, &mm, 4, NULL), DG_ERR_VALUE,
           "'masked_m': entry 0");
    set_i32(&mm, (int[]){8, 3});
    EXPECT(dg_m_grouped_bf16_gemm_nt_masked(a, b, &d, &mm, 0, NULL), DG_ERR_VALUE, "'expected_m'");
    /* empty extents name the operand they come from (issue 17: "groups, max_m, N and K ...") */
    dg_tensor a0 = *a, b0 = *b;
    a0.shape[1] = 0;
    EXPECT(dg_m_grouped_bf16_gemm_nt_masked(&a0, b, &d, &mm, 4, NULL), DG_ERR_SHAPE, "argument 'a'");
    b0.shape[1] = 0;
    EXPECT(dg_m_grouped_bf16_gemm_nt_masked(a, &b0, &d, &mm, 4, NULL), DG_ERR_SHAPE, "argument 'b'");
    a0 = *a, b0 = *b;
    a0.shape[2] = b0.shape[2] = 0;
    EXPECT(dg_m_grouped_bf16_gemm_nt_masked(&a0, &b0, &d, &mm, 4, NULL), DG_ERR_SHAPE, "argument 'a'");
    EXPECT(dg_m_grouped_bf16_gemm_nt_masked(a, b, &d, NULL, 4, NULL), DG_ERR_NULL_POINTER, "masked_m");
    dg_tensor m3 = mm;
    m3.shape[0] = 1;
    EXPECT(dg_m_grouped_bf16_gemm_nt_masked(a, b, &d, &m3, 4, NULL), DG_ERR_SHAPE, "masked_m");
    dg_tensor mf = mm;
    mf.dtype = DG_FLOAT32;
    EXPECT(dg_m_grouped_bf16_gemm_nt_masked(a, b, &d, &mf, 4, NULL), DG_ERR_DTYPE, "masked_m");
    dg_tensor b1 = *b;
    b1.shape[0] = 1;
    EXPECT(dg_m_grouped_bf16_gemm_nt_masked(a, &b1, &d, &mm, 4, NULL), DG_ERR_SHAPE, "'b'");
    dg_tensor bt = dg_tensor_transpose(tu_alloc3(DG_BFLOAT16, 2, 64, 32), 1, 2);
    EXPECT(dg_m_grouped_bf16_gemm_nt_masked(a, &bt, &d, &mm, 4, NULL), DG_ERR_LAYOUT, "'b'");
    tu_free(&bt);
    dg_tensor dx = d;
    dx.shape[2] = 16;
    EXPECT(dg_m_grouped_bf16_gemm_nt_masked(a, b, &dx, &mm, 4, NULL), DG_ERR_SHAPE, "'d'");
    EXPECT(dg_m_grouped_bf16_gemm_nt_masked(a, b, NULL, &mm, 4, NULL), DG_ERR_NULL_POINTER, "'d'");
    dg_gemm_options o = dg_gemm_options_default();
    o.use_psum_layout = 1;
    EXPECT(dg_m_grouped_bf16_gemm_nt_masked(a, b, &d, &mm, 4, &o), DG_ERR_VALUE, "'use_psum_layout'");
    o = dg_gemm_options_default();
    o.expected_m_for_psum_layout = 8;
    EXPECT(dg_m_grouped_bf16_gemm_nt_masked(a, b, &d, &mm, 4, &o), DG_ERR_VALUE, "'expected_m_for_psum_layout'");
    o = dg_gemm_options_default();
    o.recipe[0] = 1, o.recipe[1] = 1, o.recipe[2] = 128;
    EXPECT(dg_m_grouped_bf16_gemm_nt_masked(a, b, &d, &mm, 4, &o), DG_ERR_VALUE, "'recipe'");
    o.recipe[0] = 128; /* packed scales need gran_mn 1 */
    EXPECT(dg_m_grouped_fp8_fp4_gemm_nt_masked(&Aq.data, &Aq.sf, &Bq.data, &Bq.sf, &d, &mm, 4, &o), DG_ERR_VALUE,
           "sfa");
    dg_tensor sfx = Aq.sf;
    sfx.shape[1] = 7;
    EXPECT(dg_m_grouped_fp8_fp4_gemm_nt_masked(&Aq.data, &sfx, &Bq.data, &Bq.sf, &d, &mm, 4, NULL), DG_ERR_SHAPE,
           "sfa");
    EXPECT(dg_m_grouped_fp8_gemm_nt_masked(&Aq.data, &Aq.sf, &Bq.data, NULL, &d, &mm, 4, NULL), DG_ERR_NULL_POINTER,
           "sfb");
    {   /* d overlapping masked_m's memory is rejected */
        int32_t buf[2 * 8 * 32];
        memcpy(buf, mm.data, 8);
        dg_tensor dd = dg_tensor_3d(buf, DG_BFLOAT16, 2, 8, 32), mv = dg_tensor_1d(buf, DG_INT32, 2);
        void *s2 = tu_snapshot(&dd);
        expect(dg_m_grouped_bf16_gemm_nt_masked(a, b, &dd, &mv, 4, NULL), DG_ERR_LAYOUT, "masked_m", &dd, s2,
               __LINE__);
        free(s2);
    }
    free(snap);
    tu_free(&mm);
    tu_free(&d);
    tq_free(&A);
    tq_free(&B);
    tq_free(&Aq);
    tq_free(&Bq);
}

/* k-grouped: G = 2, ks = {128, 256}, M = 16, N = 8. */
static void test_k_grouped(void) {
    dg_tensor a = tu_alloc2(DG_FLOAT8_E4M3, 384, 16), b = tu_alloc2(DG_FLOAT8_E4M3, 384, 8);
    dg_tensor sfa = tu_alloc2(DG_FLOAT32, 3, 16), sfb = tu_alloc2(DG_FLOAT32, 3, 8);
    dg_tensor pa = tu_alloc2(DG_INT32, 2, 16), pb = tu_alloc2(DG_INT32, 2, 8);
    dg_tensor ab = tu_alloc2(DG_BFLOAT16, 384, 16), bb = tu_alloc2(DG_BFLOAT16, 384, 8);
    for (int i = 0; i < 48; ++i)
        ((float *)sfa.data)[i] = ((float *)sfb.data)[i % 24] = 1.0f;
    dg_tensor d = tu_alloc3(DG_FLOAT32, 2, 16, 8), c = tu_alloc3(DG_FLOAT32, 2, 16, 8);
    int ks[2] = {128, 256};
    dg_tensor gl = i32(2, ks);
    tu_fill_bytes(&d, 0x55);
    void *snap = tu_snapshot(&d);
    TU_CHECK_OK(dg_k_grouped_fp8_gemm_tn_contiguous(&a, &sfa, &b, &sfb, &d, ks, 2, &gl, &c, NULL));
    TU_CHECK_OK(dg_k_grouped_fp8_gemm_tn_contiguous(&a, &pa, &b, &pb, &d, ks, 2, &gl, NULL, NULL));
    TU_CHECK_OK(dg_k_grouped_bf16_gemm_tn_contiguous(&ab, &bb, &d, ks, 2, &gl, &d, NULL));
    tu_fill_bytes(&d, 0x55);
#define TN(...) dg_k_grouped_fp8_gemm_tn_contiguous(__VA_ARGS__)
    EXPECT(TN(NULL, &sfa, &b, &sfb, &d, ks, 2, &gl, &c, NULL), DG_ERR_NULL_POINTER, "'a'");
    EXPECT(TN(&a, NULL, &b, &sfb, &d, ks, 2, &gl, &c, NULL), DG_ERR_NULL_POINTER, "sfa");
    EXPECT(TN(&a, &sfa, &b, &sfb, &d, NULL, 2, &gl, &c, NULL), DG_ERR_NULL_POINTER, "'ks'");
    EXPECT(TN(&a, &sfa, &b, &sfb, &d, NULL, 0, &gl, &c, NULL), DG_ERR_VALUE, "'ks'");
    EXPECT(TN(&a, &sfa, &b, &sfb, &d, ks, 3, &gl, &c, NULL), DG_ERR_VALUE, "'num_ks'");
    EXPECT(TN(&a, &sfa, &b, &sfb, &d, ks, -1, &gl, &c, NULL), DG_ERR_VALUE, "'num_ks'");
    EXPECT(TN(&a, &sfa, &b, &sfb, &d, (int[]){128, 200}, 2, &gl, &c, NULL), DG_ERR_VALUE, "'ks': entry 1");
    EXPECT(TN(&a, &sfa, &b, &sfb, &d, (int[]){128, 128}, 2, &gl, &c, NULL), DG_ERR_SHAPE, "'a'");
    EXPECT(TN(&a, &sfa, &b, &sfb, &d, (int[]){256, 128}, 2, &gl, &c, NULL), DG_ERR_VALUE, "'grouped_layout': entry 0");
    dg_tensor gl1 = gl;
    gl1.shape[0] = 1;
    EXPECT(TN(&a, &sfa, &b, &sfb, &d, ks, 2, &gl1, &c, NULL), DG_ERR_SHAPE, "grouped_layout");
    dg_tensor sfa2 = sfa;
    sfa2.shape[0] = 2;
    EXPECT(TN(&a, &sfa2, &b, &sfb, &d, ks, 2, &gl, &c, NULL), DG_ERR_SHAPE, "sfa");
    dg_tensor pb1 = pb;
    pb1.shape[0] = 1;
    EXPECT(TN(&a, &pa, &b, &pb1, &d, ks, 2, &gl, &c, NULL), DG_ERR_SHAPE, "sfb");
    EXPECT(TN(&a, &sfa, &b, &pb, &d, ks, 2, &gl, &c, NULL), DG_ERR_DTYPE, "'sfb'");
    dg_tensor sfbm = sfb;
    sfbm.shape[1] = 4;
    EXPECT(TN(&a, &sfa, &b, &sfbm, &d, ks, 2, &gl, &c, NULL), DG_ERR_SHAPE, "sfb");
    EXPECT(TN(&ab, &sfa, &b, &sfb, &d, ks, 2, &gl, &c, NULL), DG_ERR_DTYPE, "'a'");
    dg_tensor at = dg_tensor_transpose(dg_tensor_2d(a.data, DG_FLOAT8_E4M3, 16, 384), 0, 1);
    EXPECT(TN(&at, &sfa, &b, &sfb, &d, ks, 2, &gl, &c, NULL), DG_ERR_LAYOUT, "'a'");
    dg_tensor bm = dg_tensor_2d(b.data, DG_FLOAT8_E4M3, 384, 4);
    EXPECT(TN(&a, &sfa, &bm, &sfb, &d, ks, 2, &gl, &c, NULL), DG_ERR_SHAPE, "'b'");
    dg_tensor dbf = d;
    dbf.dtype = DG_BFLOAT16;
    EXPECT(TN(&a, &sfa, &b, &sfb, &dbf, ks, 2, &gl, &c, NULL), DG_ERR_DTYPE, "'d'");
    dg_tensor dt = dg_tensor_transpose(d, 1, 2);
    EXPECT(TN(&a, &sfa, &b, &sfb, &dt, ks, 2, &gl, NULL, NULL), DG_ERR_LAYOUT, "'d'");
    dg_tensor cm = dg_tensor_3d(c.data, DG_FLOAT32, 2, 16, 4);
    EXPECT(TN(&a, &sfa, &b, &sfb, &d, ks, 2, &gl, &cm, NULL), DG_ERR_SHAPE, "'c'");
    dg_tensor cshift = dg_tensor_3d((float *)d.data + 1, DG_FLOAT32, 1, 16, 8);
    EXPECT(TN(&a, &sfa, &b, &sfb, &d, ks, 2, &gl, &cshift, NULL), DG_ERR_SHAPE, "'c'");
    dg_tensor cover = tu_alloc3(DG_FLOAT32, 3, 16, 8);
    dg_tensor d2 = cover, c2 = cover;
    d2.shape[0] = c2.shape[0] = 2;
    c2.data = (float *)cover.data + 128; /* same shape, overlapping memory */
    {
        void *s2 = tu_snapshot(&d2);
        expect(TN(&a, &sfa, &b, &sfb, &d2, ks, 2, &gl, &c2, NULL), DG_ERR_LAYOUT, "'c'", &d2, s2, __LINE__);
        dg_tensor dover = dg_tensor_3d(a.data, DG_FLOAT32, 2, 16, 8); /* over a's bytes */
        void *s3 = tu_snapshot(&dover);
        expect(TN(&a, &sfa, &b, &sfb, &dover, ks, 2, &gl, NULL, NULL), DG_ERR_LAYOUT, "'a'", &dover, s3, __LINE__);
        free(s2);
        free(s3);
    }
    tu_free(&cover);
    dg_gemm_options o = dg_gemm_options_default();
    o.recipe[0] = 1, o.recipe[1] = 128, o.recipe[2] = 128;
    EXPECT(TN(&a, &sfa, &b, &sfb, &d, ks, 2, &gl, &c, &o), DG_ERR_VALUE, "'recipe'");
    o.recipe[1] = 1, o.recipe[2] = 64;
    EXPECT(TN(&a, &sfa, &b, &sfb, &d, ks, 2, &gl, &c, &o), DG_ERR_VALUE, "'recipe': gran_k");
    o = dg_gemm_options_default();
    o.recipe_a[0] = 1, o.recipe_a[1] = 128;
    EXPECT(TN(&a, &sfa, &b, &sfb, &d, ks, 2, &gl, &c, &o), DG_ERR_VALUE, "'recipe_a'");
    TU_CHECK_OK(dg_set_mk_alignment_for_contiguous_layout(48));
    EXPECT(TN(&a, &sfa, &b, &sfb, &d, ks, 2, &gl, &c, NULL), DG_ERR_VALUE, "'mk_alignment_for_contiguous_layout'");
    TU_CHECK_OK(dg_set_mk_alignment_for_contiguous_layout(128));

    /* psum: ends {100, 300}: group 1 starts at 128 and owns 172 rows; ks = aligned K. */
    o = dg_gemm_options_default();
    o.use_psum_layout = 1;
    dg_tensor ps = i32(2, (int[]){100, 300});
    TU_CHECK_OK(TN(&a, &sfa, &b, &sfb, &d, ks, 2, &ps, &c, &o));
    TU_CHECK_OK(TN(&a, &sfa, &b, &sfb, &d, NULL, 0, &ps, &c, &o));
    tu_fill_bytes(&d, 0x55);
    EXPECT(TN(&a, &sfa, &b, &sfb, &d, (int[]){256, 128}, 2, &ps, &c, &o), DG_ERR_VALUE, "'ks': entry 0");
    set_i32(&ps, (int[]){100, 90});
    EXPECT(TN(&a, &sfa, &b, &sfb, &d, NULL, 0, &ps, &c, &o), DG_ERR_VALUE, "'grouped_layout': entry 1");
    set_i32(&ps, (int[]){100, 400});
    EXPECT(TN(&a, &sfa, &b, &sfb, &d, NULL, 0, &ps, &c, &o), DG_ERR_VALUE, "'grouped_layout': entry 1");
    set_i32(&ps, (int[]){-5, 300});
    EXPECT(dg_k_grouped_bf16_gemm_tn_contiguous(&ab, &bb, &d, NULL, 0, &ps, &c, &o), DG_ERR_VALUE,
           "'grouped_layout': entry 0");
    set_i32(&ps, (int[]){100, 300});
    EXPECT(TN(&a, &sfa2, &b, &sfb, &d, NULL, 0, &ps, &c, &o), DG_ERR_SHAPE, "sfa");

    /* `_nt`: flat K-major blocks, sf [MN, sum_k / 128]. */
    dg_tensor fa = tu_alloc(DG_FLOAT8_E4M3, 1, (int64_t[]){384 * 16});
    dg_tensor fb = tu_alloc(DG_FLOAT8_E4M3, 1, (int64_t[]){384 * 8});
    dg_tensor nsfa = dg_tensor_transpose(sfa, 0, 1), nsfb = dg_tensor_transpose(sfb, 0, 1);
#define NT(...) dg_k_grouped_fp8_gemm_nt_contiguous(__VA_ARGS__)
    TU_CHECK_OK(NT(&fa, &nsfa, &fb, &nsfb, &d, ks, 2, &gl, &d, NULL));
    tu_fill_bytes(&d, 0x55);
    EXPECT(NT(&fa, &nsfa, &fb, &nsfb, &d, ks, 2, &gl, &c, &o), DG_ERR_VALUE, "'use_psum_layout'");
    EXPECT(NT(&fa, &nsfa, &fb, &nsfb, &d, (int[]){64, 320}, 2, &gl, &c, NULL), DG_ERR_VALUE, "'ks': entry 0");
    dg_tensor fa2 = fa;
    fa2.shape[0] = 100;
    EXPECT(NT(&fa2, &nsfa, &fb, &nsfb, &d, ks, 2, &gl, &c, NULL), DG_ERR_SHAPE, "'a'");
    EXPECT(NT(&fa, &sfa, &fb, &nsfb, &d, ks, 2, &gl, &c, NULL), DG_ERR_SHAPE, "sfa");
    dg_tensor npa = dg_tensor_transpose(pa, 0, 1);
    EXPECT(NT(&fa, &npa, &fb, &nsfb, &d, ks, 2, &gl, &c, NULL), DG_ERR_DTYPE, "sfa");
    o = dg_gemm_options_default();
    o.recipe[0] = 1, o.recipe[1] = 1, o.recipe[2] = 32;
    EXPECT(NT(&fa, &nsfa, &fb, &nsfb, &d, ks, 2, &gl, &c, &o), DG_ERR_VALUE, "'recipe'");
    EXPECT(NT(&fa, &nsfa, NULL, &nsfb, &d, ks, 2, &gl, &c, NULL), DG_ERR_NULL_POINTER, "'b'");

    /* BF16 `_tn`. */
#define BF(...) dg_k_grouped_bf16_gemm_tn_contiguous(__VA_ARGS__)
    EXPECT(BF(&a, &bb, &d, ks, 2, &gl, &c, NULL), DG_ERR_DTYPE, "'a'");
    EXPECT(BF(&ab, &bb, NULL, ks, 2, &gl, &c, NULL), DG_ERR_NULL_POINTER, "'d'");
    EXPECT(BF(&ab, &bb, &d, (int[]){130, 254}, 2, &gl, &c, NULL), DG_ERR_VALUE, "'ks': entry 0");
    EXPECT(BF(&ab, &bb, &d, ks, 2, &gl, &c, &o), DG_ERR_VALUE, "'recipe'");
    EXPECT(BF(&ab, &bb, &d, ks, 2, NULL, &c, NULL), DG_ERR_NULL_POINTER, "grouped_layout");

    free(snap);
    dg_tensor *all[] = {&a, &b, &sfa, &sfb, &pa, &pb, &ab, &bb, &d, &c, &gl, &ps, &fa, &fb};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i)
        tu_free(all[i]);
}

int main(void) {
    tu_rng rng = {3};
    test_m_contiguous(&rng);
    test_masked(&rng);
    test_k_grouped();
    return tu_finish();
}
