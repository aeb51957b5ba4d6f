/*
 * test_gemm_grouped_k.c - k-grouped GEMMs (D[g] = C[g] + A_g^T B_g) in every form: FP8 `_tn` with
 * float32 and packed UE8M0 per-channel scales, FP8 `_nt` (K-major blocks), BF16 `_tn`; ks-only
 * and psum layouts (with and without ks), empty groups, K tails inside a scale block, C absent,
 * separate or in place. Checked bit for bit against the test's own formula and with calc_diff
 * against the unquantized math.
 */
#include "test_gemm_grouped_common.h"

typedef enum kform { KF_TN_F32, KF_TN_PACKED, KF_NT, KF_BF16 } kform;

typedef struct kcfg {
    kform form;
    int G, M, N, gran_k, k_alignment, psum;
    int c_mode;          /* 0: no C, 1: separate C, 2: C is D (in place) */
    const int *real_ks;  /* NULL: random 0.7x..1.3x of 160 */
    int explicit_recipe;
} kcfg;

/* One MN-major operand [total_k, mn] with its per-channel scales, built per group. */
typedef struct kop {
    float *orig;
    double *deq;
    dg_tensor data, sf, sf_view;
} kop;

static void make_kop(tu_rng *rng, const kcfg *cf, int64_t mn, int64_t total, const int64_t *start,
                     const int64_t *len, kop *o) {
    const int fp8 = cf->form != KF_BF16, packed = cf->form == KF_TN_PACKED, gk = cf->gran_k;
    o->orig = malloc((size_t)(total * mn + 1) * sizeof(float));
    o->deq = malloc((size_t)(total * mn + 1) * sizeof(double));
    for (int64_t e = 0; e < total * mn; ++e) {
        o->orig[e] = tq_round_bf16((float)tu_normal(rng));
        o->deq[e] = NAN;
    }
    o->data = tu_alloc2(fp8 ? DG_FLOAT8_E4M3 : DG_BFLOAT16, total, mn);
    /* Rows outside every group (psum gaps) hold NaN garbage. */
    memset(o->data.data, fp8 ? 0x7f : 0xff, dg_tensor_nbytes(&o->data));
    /* Float scales: each group owns the rows of its K aligned up (DeepGEMM's layout): with psum,
     * rows past the group's K exist and hold garbage (0x7f: NaN). Packed scales: the rows of the
     * group's own K, as DeepGEMM's packer writes them. */
    int64_t rows = 0, prows = 0, own[16];
    for (int g = 0; g < cf->G; ++g) {
        own[g] = tq_cdiv(cf->psum ? tq_align(len[g], cf->k_alignment) : len[g], gk);
        rows += own[g];
        prows += tq_cdiv(tq_cdiv(len[g], gk), 4); /* packed rows follow the group's own K */
    }
    memset(&o->sf, 0, sizeof o->sf);
    if (fp8) {
        o->sf = packed ? tu_alloc2(DG_INT32, prows, mn) : tu_alloc2(DG_FLOAT32, rows, mn);
        memset(o->sf.data, 0x7f, dg_tensor_nbytes(&o->sf));
    }
    int64_t row = 0, prow = 0;
    for (int g = 0; g < cf->G; ++g) {
        const int64_t nb = tq_cdiv(len[g], gk);
        for (int64_t b = 0; b < nb; ++b)
            for (int64_t i = 0; i < mn; ++i) {
                const int64_t r0 = start[g] + b * gk, r1 = r0 + gk < start[g] + len[g] ? r0 + gk : start[g] + len[g];
                float amax = 1e-4f;
                for (int64_t r = r0; r < r1; ++r)
                    amax = fmaxf(amax, fabsf(o->orig[r * mn + i]));
                float s = fp8 ? amax / 448.0f : 1.0f;
                if (packed)
                    s = dg_ceil_to_ue8m0(s);
                for (int64_t r = r0; r < r1; ++r) {
                    const float x = o->orig[r * mn + i];
                    if (fp8) {
                        const uint8_t c = dg_float_to_e4m3(x * (1.0f / s));
                        ((uint8_t *)o->data.data)[r * mn + i] = c;
                        o->deq[r * mn + i] = (double)dg_e4m3_to_float(c) * (double)s;
                    } else {
                        ((uint16_t *)o->data.data)[r * mn + i] = dg_float_to_bf16(x);
                        o->deq[r * mn + i] = x;
                    }
                }
                if (packed)
                    ((uint8_t *)o->sf.data)[((prow + b / 4) * mn + i) * 4 + b % 4] = tq_pow2_byte(s);
                else if (fp8)
                    ((float *)o->sf.data)[(row + b) * mn + i] = s;
            }
        row += own[g];
        prow += tq_cdiv(nb, 4);
    }
    o->sf_view = o->sf;
}

/* `_nt` form: each group's rows become an [mn, k_g] row-major block; scales [mn, blocks] as the
 * transposed view of the [blocks, mn] tensor (DeepGEMM passes sf.T). */
static void to_k_major(kop *o, int G, int64_t mn, int64_t total, const int64_t *start, const int64_t *len) {
    dg_tensor flat = tu_alloc(DG_FLOAT8_E4M3, 1, (int64_t[]){total * mn});
    for (int g = 0; g < G; ++g)
        for (int64_t i = 0; i < mn; ++i)
            for (int64_t kk = 0; kk < len[g]; ++kk)
                ((uint8_t *)flat.data)[start[g] * mn + i * len[g] + kk] =
                    ((uint8_t *)o->data.data)[(start[g] + kk) * mn + i];
    tu_free(&o->data);
    o->data = flat;
    o->sf_view = dg_tensor_transpose(o->sf, 0, 1);
}

static void free_kop(kop *o) {
    free(o->orig);
    free(o->deq);
    tu_free(&o->data);
    if (o->sf.data)
        tu_free(&o->sf);
}

static dg_status call(const kcfg *cf, kop *a, kop *b, dg_tensor *d, const int *ks, int num_ks, dg_tensor *gl,
                      dg_tensor *c) {
    dg_gemm_options o = dg_gemm_options_default();
    o.use_psum_layout = cf->psum;
    if (cf->form != KF_BF16 && (cf->explicit_recipe || cf->gran_k != 128)) {
        o.recipe[0] = o.recipe[1] = 1;
        o.recipe[2] = cf->gran_k;
    }
    switch (cf->form) {
    case KF_NT:
        return dg_k_grouped_fp8_gemm_nt_contiguous(&a->data, &a->sf_view, &b->data, &b->sf_view, d, ks, num_ks, gl,
                                                   c, &o);
    case KF_BF16:
        return dg_k_grouped_bf16_gemm_tn_contiguous(&a->data, &b->data, d, ks, num_ks, gl, c, &o);
    default:
        return dg_k_grouped_fp8_gemm_tn_contiguous(&a->data, &a->sf, &b->data, &b->sf, d, ks, num_ks, gl, c, &o);
    }
}

static void run(tu_rng *rng, const kcfg *cf) {
    TU_CHECK_OK(dg_set_mk_alignment_for_contiguous_layout(cf->k_alignment));
    const int G = cf->G, M = cf->M, N = cf->N, ka = cf->k_alignment;
    int ks[16];
    int64_t start[16], len[16], total = 0, prev_end = 0;
    dg_tensor gl = tu_alloc(DG_INT32, 1, (int64_t[]){G});
    for (int g = 0; g < G; ++g) {
        const int real = cf->real_ks ? cf->real_ks[g] : (int)(160 * (0.7 + 0.6 * tu_uniform(rng)));
        ks[g] = (int)tq_align(real, ka);
        start[g] = cf->psum ? tq_align(prev_end, ka) : total;
        len[g] = cf->psum ? real : ks[g];
        prev_end = start[g] + len[g];
        total += ks[g];
        ((int32_t *)gl.data)[g] = cf->psum ? (int32_t)prev_end : ks[g];
    }
    kop A, B;
    make_kop(rng, cf, M, total, start, len, &A);
    make_kop(rng, cf, N, total, start, len, &B);
    if (cf->form == KF_NT) {
        to_k_major(&A, G, M, total, start, len);
        to_k_major(&B, G, N, total, start, len);
    }
    dg_tensor d = tu_alloc3(DG_FLOAT32, G, M, N), c = tu_alloc3(DG_FLOAT32, G, M, N);
    tu_fill_normal(rng, c.data, (size_t)G * M * N, 32.0f);
    double *want = malloc((size_t)G * M * N * sizeof(double));
    float *exact = malloc((size_t)G * M * N * sizeof(float));
    for (int g = 0; g < G; ++g)
        for (int i = 0; i < M; ++i)
            for (int j = 0; j < N; ++j) {
                double acc = 0, e = 0;
                for (int64_t kk = 0; kk < len[g]; ++kk) {
                    const int64_t r = start[g] + kk;
                    acc += A.deq[r * M + i] * B.deq[r * N + j];
                    e += (double)A.orig[r * M + i] * B.orig[r * N + j];
                }
                const double cv = cf->c_mode ? ((float *)c.data)[((int64_t)g * M + i) * N + j] : 0.0;
                want[((int64_t)g * M + i) * N + j] = acc + cv;
                exact[((int64_t)g * M + i) * N + j] = (float)(e + cv);
            }
    /* Unsynced psum path (no ks) too, as DeepGEMM's tests do. */
    for (int pass = 0; pass < (cf->psum ? 2 : 1); ++pass) {
        if (cf->c_mode == 2)
            memcpy(d.data, c.data, dg_tensor_nbytes(&d));
        else
            tu_fill_bytes(&d, 0xA5);
        const dg_status s = call(cf, &A, &B, &d, pass ? NULL : ks, pass ? 0 : G, &gl,
                                 cf->c_mode == 0 ? NULL : (cf->c_mode == 1 ? &c : &d));
        TU_CHECK(s == DG_OK, "form %d psum %d pass %d: %s", cf->form, cf->psum, pass, dg_last_error());
        int64_t mism = 0;
        for (int64_t e = 0; e < (int64_t)G * M * N; ++e)
            mism += ((float *)d.data)[e] != (float)want[e];
        const double diff = tu_calc_diff(d.data, exact, (size_t)G * M * N);
        TU_CHECK(mism == 0, "form %d G=%d gran_k=%d align=%d psum=%d c=%d pass %d: %lld elements differ", cf->form, G,
                 cf->gran_k, ka, cf->psum, cf->c_mode, pass, (long long)mism);
        TU_CHECK(diff < (cf->form == KF_BF16 ? 1e-5 : 1e-3), "form %d: calc_diff %.3g", cf->form, diff);
    }
    free(want);
    free(exact);
    tu_free(&d);
    tu_free(&c);
    tu_free(&gl);
    free_kop(&A);
    free_kop(&B);
}

int main(void) {
    /* These checks are bit-exact against double accumulation: they pin the reference (oracle)
     * backend. The engine (float32 accumulation) is checked in test_engine_grouped.c. */
    TU_CHECK_OK(dg_set_backend(DG_BACKEND_REFERENCE));
    tu_rng rng = {7};
    static const int with_empty[4] = {256, 0, 130, 384};
    static const int tails[3] = {96, 0, 200};    /* K tails inside a gran_k block */
    static const int single[1] = {300};
    static const int all_empty[3] = {0, 0, 0};
    /* FP8 `_tn`, float32 scales: ks layout and psum layout, several alignments and gran_k. */
    run(&rng, &(kcfg){KF_TN_F32, 4, 64, 48, 128, 128, 0, 1, NULL, 0});
    run(&rng, &(kcfg){KF_TN_F32, 4, 64, 48, 128, 128, 0, 2, with_empty, 1});
    run(&rng, &(kcfg){KF_TN_F32, 3, 40, 72, 128, 32, 0, 0, tails, 0});
    run(&rng, &(kcfg){KF_TN_F32, 3, 40, 72, 128, 32, 1, 1, tails, 0});
    run(&rng, &(kcfg){KF_TN_F32, 4, 32, 32, 32, 64, 1, 2, NULL, 0});
    /* FP8 `_tn`, packed UE8M0 scales (each group starts a new packed row). */
    run(&rng, &(kcfg){KF_TN_PACKED, 4, 64, 48, 128, 128, 0, 1, with_empty, 0});
    run(&rng, &(kcfg){KF_TN_PACKED, 3, 40, 72, 32, 32, 0, 2, tails, 0});
    run(&rng, &(kcfg){KF_TN_PACKED, 3, 40, 72, 32, 32, 1, 0, tails, 0});
    run(&rng, &(kcfg){KF_TN_PACKED, 4, 32, 40, 128, 64, 1, 1, NULL, 0});
    run(&rng, &(kcfg){KF_TN_PACKED, 3, 40, 72, 32, 128, 1, 1, tails, 0});
    run(&rng, &(kcfg){KF_TN_F32, 3, 40, 72, 32, 128, 1, 2, tails, 0});
    /* FP8 `_nt` (K-major blocks, ks multiples of 128). */
    run(&rng, &(kcfg){KF_NT, 4, 64, 48, 128, 128, 0, 1, with_empty, 0});
    run(&rng, &(kcfg){KF_NT, 1, 24, 40, 128, 128, 0, 2, single, 1});
    /* BF16 `_tn`. */
    run(&rng, &(kcfg){KF_BF16, 4, 64, 48, 1, 128, 0, 1, with_empty, 0});
    run(&rng, &(kcfg){KF_BF16, 3, 40, 72, 1, 32, 1, 2, tails, 0});
    run(&rng, &(kcfg){KF_BF16, 1, 24, 40, 1, 32, 0, 0, single, 0});
    /* Every group empty: D = C (or 0). */
    run(&rng, &(kcfg){KF_TN_F32, 3, 16, 16, 128, 128, 0, 1, all_empty, 0});
    run(&rng, &(kcfg){KF_BF16, 3, 16, 16, 1, 128, 0, 0, all_empty, 0});
    run(&rng, &(kcfg){KF_NT, 3, 16, 16, 128, 128, 0, 2, all_empty, 0});
    TU_CHECK_OK(dg_set_mk_alignment_for_contiguous_layout(128));
    return tu_finish();
}
