/*
 * test_gemm_grouped_k_fp4.c - DeepGEMM 2.8's k-grouped FP4 GEMM (dg_k_grouped_fp4_gemm_nt_contiguous):
 * D[g] = C[g] + A_g B_g^T with A [M, sum_k] and B [N, sum_k] packed E2M1 (K-major), per-channel
 * scales along K in blocks of 32, MN-major, float32 or packed UE8M0.
 *
 * Operands are built here from random codes and scales, group by group, with garbage in every
 * byte the GEMM must not read (psum gaps, scale rows past a group's K). Each case is checked
 *  - bit for bit on every engine variant against the contract's formula (include/deepgemm.h,
 *    dense-gemm: exact integer dot products per block, acc = fma(dot, (0.25 sa) sb, acc) in block
 *    order, D = round(C + acc)), for 1 and 3 threads;
 *  - on the reference backend against the double-precision sum (calc_diff);
 * over ks and psum layouts (with and without ks), empty groups, odd K in psum, tails in M and N,
 * C absent, separate or D itself. Bad input: the status, the argument named, D untouched.
 */
#include "common/engine_variants.h"
#include "test_gemm_grouped_common.h"

#define KMAX_G 8

typedef struct fcfg {
    int G, M, N, alignment, psum, packed_sf;
    int c_mode;          /* 0: no C, 1: separate C, 2: C is D */
    const int *real_ks;  /* logical K per group */
    int with_ks;         /* psum: pass ks too */
} fcfg;

/* One operand: codes [mn, sum_k] (nibbles), scale values per (block row, mn), and the tensors. */
typedef struct fop {
    int64_t mn, sum_k;
    uint8_t *code;       /* [mn * sum_k] logical codes (garbage outside groups) */
    float *scale;        /* [rows * mn] */
    dg_tensor data, sf;
} fop;

typedef struct layout {
    int G;
    int64_t start[KMAX_G], len[KMAX_G], row0[KMAX_G], rows, prows, sum_k;
    int ks[KMAX_G], gl[KMAX_G];
} layout;

static layout plan(const fcfg *cf) {
    layout L;
    memset(&L, 0, sizeof L);
    L.G = cf->G;
    int64_t prev_end = 0, total = 0, row = 0, prow = 0;
    for (int g = 0; g < cf->G; ++g) {
        const int real = cf->real_ks[g];
        L.ks[g] = (int)tq_align(real, cf->alignment);
        L.start[g] = cf->psum ? tq_align(prev_end, cf->alignment) : total;
        L.len[g] = cf->psum ? real : L.ks[g];
        prev_end = L.start[g] + L.len[g];
        total += L.ks[g];
        L.gl[g] = cf->psum ? (int)prev_end : L.ks[g];
        L.row0[g] = cf->packed_sf ? prow : row;
        /* float rows: those of the aligned K; packed rows: the group's own K (DeepGEMM's) */
        row += tq_cdiv(L.ks[g], 32);
        prow += tq_cdiv(tq_cdiv(L.len[g], 32), 4);
    }
    L.rows = row, L.prows = prow;
    /* With ks, A's K is sum(ks) (DeepGEMM's check); without (psum only) any K past the last end:
     * here with a tail the GEMM never reads. */
    L.sum_k = (!cf->psum || cf->with_ks) ? total : tq_align(prev_end, 2) + 2 * cf->alignment;
    return L;
}

static fop make_op(tu_rng *r, const fcfg *cf, const layout *L, int64_t mn) {
    fop o;
    o.mn = mn, o.sum_k = L->sum_k;
    o.code = malloc((size_t)(mn * L->sum_k + 1));
    for (int64_t e = 0; e < mn * L->sum_k; ++e)
        o.code[e] = (uint8_t)(tu_next(r) & 15); /* garbage where no group reads */
    for (int g = 0; g < L->G; ++g)
        if (L->len[g] % 2) /* the odd tail's partner code is padding: zero by contract */
            for (int64_t i = 0; i < mn; ++i)
                o.code[i * L->sum_k + L->start[g] + L->len[g]] = 0;
    const int64_t rows = L->rows;
    o.scale = malloc((size_t)(rows * mn + 1) * sizeof(float));
    for (int64_t e = 0; e < rows * mn; ++e)
        o.scale[e] = cf->packed_sf ? ldexpf(1.0f, (int)tu_randint(r, -4, 4))
                                   : (float)(0.5 + tu_uniform(r)) * ldexpf(1.0f, (int)tu_randint(r, -3, 3));
    o.data = tu_alloc2(DG_FP4_E2M1X2, mn, L->sum_k / 2);
    for (int64_t i = 0; i < mn; ++i)
        for (int64_t k = 0; k < L->sum_k; k += 2)
            ((uint8_t *)o.data.data)[i * (L->sum_k / 2) + k / 2] =
                (uint8_t)(o.code[i * L->sum_k + k] | (o.code[i * L->sum_k + k + 1] << 4));
    if (cf->packed_sf) {
        o.sf = tu_alloc2(DG_INT32, L->prows, mn);
        memset(o.sf.data, 0x7f, dg_tensor_nbytes(&o.sf));
        int64_t row = 0;
        for (int g = 0; g < L->G; ++g) {
            const int64_t own = tq_cdiv(L->ks[g], 32);
            for (int64_t b = 0; b < tq_cdiv(L->len[g], 32); ++b)
                for (int64_t i = 0; i < mn; ++i)
                    ((uint8_t *)o.sf.data)[((L->row0[g] + b / 4) * mn + i) * 4 + b % 4] =
                        tq_pow2_byte(o.scale[(row + b) * mn + i]);
            row += own;
        }
    } else {
        o.sf = tu_alloc2(DG_FLOAT32, rows, mn);
        memcpy(o.sf.data, o.scale, (size_t)(rows * mn) * sizeof(float));
    }
    return o;
}

static void free_op(fop *o) {
    free(o->code);
    free(o->scale);
    tu_free(&o->data);
    tu_free(&o->sf);
}

static dg_status call(const fop *a, const fop *b, const dg_tensor *d, const fcfg *cf, const layout *L,
                      const dg_tensor *gl, const dg_tensor *c) {
    dg_gemm_options o = dg_gemm_options_default();
    o.use_psum_layout = cf->psum;
    const int pass_ks = !cf->psum || cf->with_ks;
    return dg_k_grouped_fp4_gemm_nt_contiguous(&a->data, &a->sf, &b->data, &b->sf, d, pass_ks ? L->ks : NULL,
                                               pass_ks ? L->G : 0, gl, c, &o);
}

/* The contract's float32 formula for D[g, i, j] (without C), and the double-precision sum. */
static float formula(const fop *a, const fop *b, const layout *L, int g, int64_t i, int64_t j, double *exact) {
    float acc = 0.0f;
    double e = 0.0;
    int64_t row = 0;
    for (int q = 0; q < g; ++q)
        row += tq_cdiv(L->ks[q], 32);
    const int64_t len = L->len[g] + (L->len[g] & 1);
    for (int64_t b0 = 0; b0 < len; b0 += 32) {
        int dot = 0;
        for (int64_t k = b0; k < b0 + 32 && k < len; ++k) {
            const int64_t kk = L->start[g] + k;
            const float x = dg_e2m1_to_float(a->code[i * a->sum_k + kk]), y = dg_e2m1_to_float(b->code[j * b->sum_k + kk]);
            dot += (int)(2 * x) * (int)(2 * y);
        }
        const float sa = a->scale[(row + b0 / 32) * a->mn + i], sb = b->scale[(row + b0 / 32) * b->mn + j];
        acc = fmaf((float)dot, (0.25f * sa) * sb, acc);
        e += 0.25 * dot * (double)sa * sb;
    }
    *exact = e;
    return acc;
}

static void run(tu_rng *r, const fcfg *cf) {
    TU_CHECK_OK(dg_set_mk_alignment_for_contiguous_layout(cf->alignment));
    const layout L = plan(cf);
    fop A = make_op(r, cf, &L, cf->M), B = make_op(r, cf, &L, cf->N);
    dg_tensor gl = tu_alloc(DG_INT32, 1, (int64_t[]){cf->G});
    memcpy(gl.data, L.gl, (size_t)cf->G * sizeof(int));
    const int64_t total = (int64_t)cf->G * cf->M * cf->N;
    dg_tensor c0 = tu_alloc3(DG_FLOAT32, cf->G, cf->M, cf->N);
    tu_fill_normal(r, c0.data, (size_t)total, 32.0f);
    uint32_t *want = malloc((size_t)(total + 1) * sizeof(uint32_t));
    float *exact = malloc((size_t)(total + 1) * sizeof(float));
    for (int g = 0; g < cf->G; ++g)
        for (int64_t i = 0; i < cf->M; ++i)
            for (int64_t j = 0; j < cf->N; ++j) {
                const int64_t at = ((int64_t)g * cf->M + i) * cf->N + j;
                double e;
                const float acc = L.len[g] ? formula(&A, &B, &L, g, i, j, &e) : (e = 0, 0.0f);
                const float cv = cf->c_mode ? ((float *)c0.data)[at] : 0.0f;
                const float v = cv + acc;
                memcpy(&want[at], &v, 4);
                exact[at] = (float)(e + cv);
            }
    const dg_isa best = dg_get_isa();
    const int saved_threads = dg_get_num_sms();
    for (int v = 0; v <= tu_engine_variants(best); ++v) { /* the last pass: the reference */
        const int ref = v == tu_engine_variants(best);
        if (ref)
            TU_CHECK_OK(dg_set_backend(DG_BACKEND_REFERENCE));
        else
            tu_engine_variant_set(v);
        for (int threads = 1; threads <= 3; threads += 2) {
            TU_CHECK_OK(dg_set_num_sms(threads));
            dg_tensor d = tu_alloc3(DG_FLOAT32, cf->G, cf->M, cf->N), c = tu_alloc3(DG_FLOAT32, cf->G, cf->M, cf->N);
            memcpy(c.data, c0.data, (size_t)total * 4);
            memset(d.data, 0x7b, (size_t)total * 4);
            if (cf->c_mode == 2)
                memcpy(d.data, c0.data, (size_t)total * 4);
            const dg_tensor *cp = cf->c_mode == 0 ? NULL : cf->c_mode == 1 ? &c : &d;
            const dg_status s = call(&A, &B, &d, cf, &L, &gl, cp);
            TU_CHECK(s == DG_OK, "G=%d psum=%d: %s", cf->G, cf->psum, dg_last_error());
            if (!ref) {
                TU_CHECK(memcmp(d.data, want, (size_t)total * 4) == 0,
                         "variant %d threads %d G=%d M=%d N=%d psum=%d ks=%d packed=%d c=%d: D differs from the formula", v,
                         threads, cf->G, cf->M, cf->N, cf->psum, cf->with_ks, cf->packed_sf, cf->c_mode);
            } else {
                const double diff = tu_calc_diff(d.data, exact, (size_t)total);
                TU_CHECK(diff < 1e-9, "reference: calc_diff %.3g against the double sum", diff);
            }
            tu_free(&d);
            tu_free(&c);
        }
    }
    TU_CHECK_OK(dg_set_backend(DG_BACKEND_AUTO));
    tu_engine_variants_done(best);
    TU_CHECK_OK(dg_set_num_sms(saved_threads));
    free(want);
    free(exact);
    tu_free(&c0);
    tu_free(&gl);
    free_op(&A);
    free_op(&B);
}

static void test_bad(tu_rng *r) {
    static const int ks3[3] = {256, 0, 512};
    const fcfg cf = {3, 8, 16, 256, 0, 0, 1, ks3, 1};
    TU_CHECK_OK(dg_set_mk_alignment_for_contiguous_layout(256));
    const layout L = plan(&cf);
    fop A = make_op(r, &cf, &L, 8), B = make_op(r, &cf, &L, 16);
    dg_tensor gl = tu_alloc(DG_INT32, 1, (int64_t[]){3});
    memcpy(gl.data, L.gl, sizeof L.gl[0] * 3);
    dg_tensor d = tu_alloc3(DG_FLOAT32, 3, 8, 16);
    tu_fill_bytes(&d, 0x3c);
    void *snap = tu_snapshot(&d);
    dg_gemm_options o = dg_gemm_options_default();
    o.recipe[0] = 1, o.recipe[1] = 1, o.recipe[2] = 128;
    TU_CHECK_STATUS(dg_k_grouped_fp4_gemm_nt_contiguous(&A.data, &A.sf, &B.data, &B.sf, &d, L.ks, 3, &gl, NULL, &o),
                    DG_ERR_VALUE);
    TU_CHECK(strstr(dg_last_error(), "recipe") && strstr(dg_last_error(), "dg_k_grouped_fp4_gemm_nt_contiguous"),
             "message: %s", dg_last_error());
    o = dg_gemm_options_default();
    o.has_alpha = 1, o.alpha = 2.0f;
    TU_CHECK_STATUS(dg_k_grouped_fp4_gemm_nt_contiguous(&A.data, &A.sf, &B.data, &B.sf, &d, L.ks, 3, &gl, NULL, &o),
                    DG_ERR_UNSUPPORTED);
    /* The K alignment must be a multiple of 256. */
    TU_CHECK_OK(dg_set_mk_alignment_for_contiguous_layout(128));
    TU_CHECK_STATUS(dg_k_grouped_fp4_gemm_nt_contiguous(&A.data, &A.sf, &B.data, &B.sf, &d, L.ks, 3, &gl, NULL, NULL),
                    DG_ERR_VALUE);
    TU_CHECK(strstr(dg_last_error(), "256") != NULL, "message: %s", dg_last_error());
    TU_CHECK_OK(dg_set_mk_alignment_for_contiguous_layout(256));
    /* A of the wrong dtype, of the wrong K, scales of the wrong extent, ks disagreeing with the layout. */
    dg_tensor a8 = A.data;
    a8.dtype = DG_FLOAT8_E4M3;
    TU_CHECK_STATUS(dg_k_grouped_fp4_gemm_nt_contiguous(&a8, &A.sf, &B.data, &B.sf, &d, L.ks, 3, &gl, NULL, NULL),
                    DG_ERR_DTYPE);
    dg_tensor ashort = A.data;
    ashort.shape[1] -= 1;
    ashort.strides[0] = ashort.shape[1];
    TU_CHECK_STATUS(dg_k_grouped_fp4_gemm_nt_contiguous(&ashort, &A.sf, &B.data, &B.sf, &d, L.ks, 3, &gl, NULL, NULL),
                    DG_ERR_SHAPE);
    dg_tensor sfshort = A.sf;
    sfshort.shape[0] -= 1;
    TU_CHECK_STATUS(dg_k_grouped_fp4_gemm_nt_contiguous(&A.data, &sfshort, &B.data, &B.sf, &d, L.ks, 3, &gl, NULL, NULL),
                    DG_ERR_SHAPE);
    const int badks[3] = {256, 256, 256};
    TU_CHECK_STATUS(dg_k_grouped_fp4_gemm_nt_contiguous(&A.data, &A.sf, &B.data, &B.sf, &d, badks, 3, &gl, NULL, NULL),
                    DG_ERR_VALUE);
    TU_CHECK_STATUS(dg_k_grouped_fp4_gemm_nt_contiguous(&A.data, &A.sf, &B.data, &B.sf, &d, NULL, 0, &gl, NULL, NULL),
                    DG_ERR_VALUE);
    TU_CHECK(tu_unchanged(&d, snap), "D written on error");
    free(snap);
    tu_free(&d);
    tu_free(&gl);
    free_op(&A);
    free_op(&B);

    /* psum with an odd K: the padding code after the group must be zero. */
    static const int odd1[2] = {101, 64};
    const fcfg co = {2, 3, 5, 256, 1, 0, 0, odd1, 1};
    const layout Lo = plan(&co);
    fop Ao = make_op(r, &co, &Lo, 3), Bo = make_op(r, &co, &Lo, 5);
    dg_tensor glo = tu_alloc(DG_INT32, 1, (int64_t[]){2});
    memcpy(glo.data, Lo.gl, sizeof Lo.gl[0] * 2);
    dg_tensor dd = tu_alloc3(DG_FLOAT32, 2, 3, 5);
    dg_gemm_options po = dg_gemm_options_default();
    po.use_psum_layout = 1;
    TU_CHECK_OK(dg_k_grouped_fp4_gemm_nt_contiguous(&Ao.data, &Ao.sf, &Bo.data, &Bo.sf, &dd, Lo.ks, 2, &glo, NULL, &po));
    ((uint8_t *)Bo.data.data)[2 * (Lo.sum_k / 2) + 101 / 2] |= 0x30; /* row 2's padding code */
    tu_fill_bytes(&dd, 0x3c);
    void *snapo = tu_snapshot(&dd);
    TU_CHECK_STATUS(dg_k_grouped_fp4_gemm_nt_contiguous(&Ao.data, &Ao.sf, &Bo.data, &Bo.sf, &dd, Lo.ks, 2, &glo, NULL, &po),
                    DG_ERR_VALUE);
    TU_CHECK(strstr(dg_last_error(), "'b'") && strstr(dg_last_error(), "padding"), "message: %s", dg_last_error());
    TU_CHECK(tu_unchanged(&dd, snapo), "D written on error");
    free(snapo);
    tu_free(&dd);
    tu_free(&glo);
    free_op(&Ao);
    free_op(&Bo);
    TU_CHECK_OK(dg_set_mk_alignment_for_contiguous_layout(128));
}

int main(void) {
    tu_rng rng = {5};
    static const int ks4[4] = {256, 0, 512, 256};
    static const int odd[3] = {100, 0, 333};
    static const int one[1] = {40};
    static const int none[2] = {0, 0};
    run(&rng, &(fcfg){4, 17, 24, 256, 0, 0, 1, ks4, 1});
    run(&rng, &(fcfg){4, 1, 9, 256, 0, 1, 2, ks4, 1});
    run(&rng, &(fcfg){3, 13, 7, 256, 1, 0, 0, odd, 1});
    run(&rng, &(fcfg){3, 13, 7, 512, 1, 1, 1, odd, 0});
    run(&rng, &(fcfg){1, 5, 33, 256, 1, 0, 2, one, 0});
    run(&rng, &(fcfg){2, 4, 4, 256, 0, 0, 1, none, 1});
    test_bad(&rng);
    return tu_finish();
}
