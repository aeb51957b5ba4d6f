/* test_einsum.c - dg_einsum and dg_fp8_einsum (SPEC 7) against naive loops written here. */
#include "test_util.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define CHECK_FAIL(expr, want, argname)                                                          \
    do {                                                                                         \
        TU_CHECK_STATUS(expr, want);                                                             \
        TU_CHECK(strstr(dg_last_error(), argname) != NULL, "message names '%s': %s", argname,    \
                 dg_last_error());                                                               \
    } while (0)

/* A BF16 tensor of the given shape with random values, and its float copy (row-major). */
static dg_tensor rand_bf16(tu_rng *rng, int64_t d0, int64_t d1, int64_t d2, float **vals) {
    dg_tensor t = tu_alloc3(DG_BFLOAT16, d0, d1, d2);
    const int64_t n = d0 * d1 * d2;
    *vals = malloc((size_t)(n ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = dg_float_to_bf16((float)tu_normal(rng));
        ((uint16_t *)t.data)[i] = h;
        (*vals)[i] = dg_bf16_to_float(h);
    }
    return t;
}

/* Reads element (i, j, k) of a 3-D FLOAT32/BFLOAT16 tensor through its strides. */
static float at3(const dg_tensor *t, int64_t i, int64_t j, int64_t k) {
    const int64_t off = i * t->strides[0] + j * t->strides[1] + k * t->strides[2];
    return t->dtype == DG_FLOAT32 ? ((float *)t->data)[off] : dg_bf16_to_float(((uint16_t *)t->data)[off]);
}

static float round_to(dg_dtype dt, double v) {
    return dt == DG_FLOAT32 ? (float)v : dg_bf16_to_float(dg_float_to_bf16((float)v));
}

/* ---- "bmk,bnk->mn" ------------------------------------------------------------------------- */

static void test_bmk_bnk_mn(tu_rng *rng) {
    const int64_t s = 3, m = 5, n = 7, k = 9;
    float *av, *bv;
    dg_tensor a = rand_bf16(rng, s, m, k, &av), b = rand_bf16(rng, s, n, k, &bv);
    double *ref = calloc((size_t)(m * n), sizeof(double));
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j)
            for (int64_t q = 0; q < s; ++q)
                for (int64_t p = 0; p < k; ++p)
                    ref[i * n + j] += (double)av[(q * m + i) * k + p] * bv[(q * n + j) * k + p];
    /* float32 D accumulating C in place (DeepGEMM's form), then absent C, then separate C. */
    dg_tensor d = tu_alloc2(DG_FLOAT32, m, n), c2 = tu_alloc2(DG_FLOAT32, m, n);
    tu_fill_normal(rng, d.data, (size_t)(m * n), 10.0f);
    float *c0 = malloc((size_t)(m * n) * sizeof(float));
    memcpy(c0, d.data, (size_t)(m * n) * sizeof(float));
    memcpy(c2.data, c0, (size_t)(m * n) * sizeof(float));
    TU_CHECK_OK(dg_einsum("bmk,bnk->mn", &a, &b, &d, &d));
    int bad = 0;
    for (int64_t i = 0; i < m * n; ++i)
        bad += ((float *)d.data)[i] != (float)(ref[i] + c0[i]);
    TU_CHECK(bad == 0, "bmk,bnk->mn with C == D: %d wrong", bad);
    TU_CHECK_OK(dg_einsum("bmk,bnk->mn", &a, &b, &d, NULL));
    bad = 0;
    for (int64_t i = 0; i < m * n; ++i)
        bad += ((float *)d.data)[i] != (float)ref[i];
    TU_CHECK(bad == 0, "bmk,bnk->mn without C: %d wrong", bad);
    TU_CHECK_OK(dg_einsum("bmk,bnk->mn", &a, &b, &d, &c2));
    bad = 0;
    for (int64_t i = 0; i < m * n; ++i)
        bad += ((float *)d.data)[i] != (float)(ref[i] + c0[i]);
    TU_CHECK(bad == 0, "bmk,bnk->mn with separate C: %d wrong", bad);
    /* BF16 D. */
    dg_tensor dh = tu_alloc2(DG_BFLOAT16, m, n);
    TU_CHECK_OK(dg_einsum("bmk,bnk->mn", &a, &b, &dh, NULL));
    bad = 0;
    for (int64_t i = 0; i < m * n; ++i)
        bad += dg_bf16_to_float(((uint16_t *)dh.data)[i]) != round_to(DG_BFLOAT16, ref[i]);
    TU_CHECK(bad == 0, "bmk,bnk->mn bf16: %d wrong", bad);
    /* K = 0: D = C. */
    const dg_tensor a0 = dg_tensor_3d(a.data, DG_BFLOAT16, s, m, 0), b0 = dg_tensor_3d(b.data, DG_BFLOAT16, s, n, 0);
    TU_CHECK_OK(dg_einsum("bmk,bnk->mn", &a0, &b0, &d, &c2));
    TU_CHECK(memcmp(d.data, c0, (size_t)(m * n) * 4) == 0, "K = 0 gives D = C");

    /* Bad inputs. */
    tu_fill_bytes(&d, 0x42), tu_fill_bytes(&dh, 0x42);
    void *sd = tu_snapshot(&d), *sdh = tu_snapshot(&dh);
    CHECK_FAIL(dg_einsum("bmk,bnk->mn", &a, &b, &dh, &dh), DG_ERR_VALUE, "'c'");
    CHECK_FAIL(dg_einsum("bmk,bnk->mn", &a, &b, &d, &dh), DG_ERR_DTYPE, "'c'");
    const dg_tensor b_k = dg_tensor_3d(b.data, DG_BFLOAT16, s, n, k - 1);
    CHECK_FAIL(dg_einsum("bmk,bnk->mn", &a, &b_k, &d, NULL), DG_ERR_SHAPE, "'b'");
    const dg_tensor b_s = dg_tensor_3d(b.data, DG_BFLOAT16, s - 1, n, k);
    CHECK_FAIL(dg_einsum("bmk,bnk->mn", &a, &b_s, &d, NULL), DG_ERR_SHAPE, "'b'");
    const dg_tensor a_sq = dg_tensor_3d(a.data, DG_BFLOAT16, s, k, k);
    CHECK_FAIL(dg_einsum("bmk,bnk->mn", &a_sq, &b, &d, NULL), DG_ERR_SHAPE, "'d'");
    const dg_tensor a_tt = dg_tensor_transpose(dg_tensor_3d(a.data, DG_BFLOAT16, s, k, m), 1, 2);
    CHECK_FAIL(dg_einsum("bmk,bnk->mn", &a_tt, &b, &d, NULL), DG_ERR_LAYOUT, "'a'");
    const dg_tensor d_t = dg_tensor_transpose(dg_tensor_2d(d.data, DG_FLOAT32, n, m), 0, 1);
    CHECK_FAIL(dg_einsum("bmk,bnk->mn", &a, &b, &d_t, NULL), DG_ERR_LAYOUT, "'d'");
    const dg_tensor c_shift = dg_tensor_2d((float *)d.data + 1, DG_FLOAT32, m, n);
    CHECK_FAIL(dg_einsum("bmk,bnk->mn", &a, &b, &d, &c_shift), DG_ERR_LAYOUT, "'c'");
    const dg_tensor c_small = dg_tensor_2d(c2.data, DG_FLOAT32, m, n - 1);
    CHECK_FAIL(dg_einsum("bmk,bnk->mn", &a, &b, &d, &c_small), DG_ERR_SHAPE, "'c'");
    const dg_tensor d_on_a = dg_tensor_2d(a.data, DG_FLOAT32, m, n);
    CHECK_FAIL(dg_einsum("bmk,bnk->mn", &a, &b, &d_on_a, NULL), DG_ERR_LAYOUT, "'d'");
    const dg_tensor d_i = dg_tensor_2d(d.data, DG_INT32, m, n);
    CHECK_FAIL(dg_einsum("bmk,bnk->mn", &a, &b, &d_i, NULL), DG_ERR_DTYPE, "'d'");
    dg_tensor af = a;
    af.dtype = DG_FLOAT8_E4M3;
    CHECK_FAIL(dg_einsum("bmk,bnk->mn", &af, &b, &d, NULL), DG_ERR_DTYPE, "'a'");
    CHECK_FAIL(dg_einsum("bmk,bnk->mn", &a, NULL, &d, NULL), DG_ERR_NULL_POINTER, "'b'");
    CHECK_FAIL(dg_einsum(NULL, &a, &b, &d, NULL), DG_ERR_NULL_POINTER, "expr");
    CHECK_FAIL(dg_einsum("bmk,bnk->nm", &a, &b, &d, NULL), DG_ERR_VALUE, "'bmk,bnk->mn', 'bhr,hdr->bhd', 'bhd,hdr->bhr'");
    CHECK_FAIL(dg_einsum("bhd,bhr->hdr", &a, &b, &d, NULL), DG_ERR_VALUE, "supported");
    TU_CHECK(tu_unchanged(&d, sd) && tu_unchanged(&dh, sdh), "failed einsum calls write nothing");
    free(sd), free(sdh), free(ref), free(c0), free(av), free(bv);
    tu_free(&a), tu_free(&b), tu_free(&d), tu_free(&c2), tu_free(&dh);
}

/* ---- "bhr,hdr->bhd" and "bhd,hdr->bhr" ------------------------------------------------------ */

/* x [B, H, X], y a view [H, D, R] of [H, D, R + 8], z [B, H, Z] inside [B, H, Z + zpad].
 * bhd_out: z = "bhr,hdr->bhd" (X = R, Z = D), else "bhd,hdr->bhr" (X = D, Z = R). */
static void run_heads(tu_rng *rng, bool bhd_out, int64_t bb, int64_t h, int64_t r, int64_t dd, int64_t zpad) {
    const int64_t xk = bhd_out ? r : dd, zn = bhd_out ? dd : r;
    float *xv, *fyv;
    dg_tensor x = rand_bf16(rng, bb, h, xk, &xv), fy = rand_bf16(rng, h, dd, r + 8, &fyv);
    dg_tensor y = fy;
    y.shape[2] = r;
    dg_tensor zbuf = tu_alloc3(DG_BFLOAT16, bb, h, zn + zpad);
    tu_fill_bytes(&zbuf, 0x3C);
    dg_tensor z = zbuf;
    z.shape[2] = zn;
    const char *expr = bhd_out ? "bhr,hdr->bhd" : "bhd,hdr->bhr";
    TU_CHECK_OK(dg_einsum(expr, &x, &y, &z, NULL));
    int bad = 0;
    float *got = malloc((size_t)(bb * h * zn) * sizeof(float)), *want = malloc((size_t)(bb * h * zn) * sizeof(float));
    for (int64_t b = 0; b < bb; ++b)
        for (int64_t hh = 0; hh < h; ++hh)
            for (int64_t o = 0; o < zn; ++o) {
                double acc = 0;
                for (int64_t q = 0; q < xk; ++q) {
                    /* y[h, d, r]: bhd_out sums over r with d = o; else sums over d with r = o. */
                    const float yv = bhd_out ? at3(&y, hh, o, q) : at3(&y, hh, q, o);
                    acc += (double)xv[(b * h + hh) * xk + q] * yv;
                }
                const int64_t e = (b * h + hh) * zn + o;
                got[e] = at3(&z, b, hh, o);
                want[e] = round_to(DG_BFLOAT16, acc);
                bad += got[e] != want[e];
            }
    TU_CHECK(bad == 0, "%s (B=%lld H=%lld R=%lld D=%lld): %d wrong", expr, (long long)bb, (long long)h, (long long)r,
             (long long)dd, bad);
    TU_CHECK(tu_calc_diff(got, want, (size_t)(bb * h * zn)) < 1e-10, "%s calc_diff", expr);
    int pad_bad = 0;
    for (int64_t b = 0; b < bb; ++b)
        for (int64_t hh = 0; hh < h; ++hh)
            for (int64_t p = 0; p < zpad; ++p)
                pad_bad += ((uint16_t *)zbuf.data)[(b * h + hh) * (zn + zpad) + zn + p] != 0x3C3C;
    TU_CHECK(pad_bad == 0, "%s leaves the padding of a strided z alone", expr);
    free(got), free(want), free(xv), free(fyv);
    tu_free(&x), tu_free(&fy), tu_free(&zbuf);
}

static void test_heads_errors(tu_rng *rng) {
    float *xv, *yv;
    dg_tensor x = rand_bf16(rng, 2, 3, 16, &xv), y = rand_bf16(rng, 3, 5, 16, &yv);
    dg_tensor z = tu_alloc3(DG_BFLOAT16, 2, 3, 5), zf = tu_alloc3(DG_FLOAT32, 2, 3, 5);
    tu_fill_bytes(&z, 0x61), tu_fill_bytes(&zf, 0x61);
    void *sz = tu_snapshot(&z), *szf = tu_snapshot(&zf);
    CHECK_FAIL(dg_einsum("bhr,hdr->bhd", &x, &y, &z, &z), DG_ERR_VALUE, "'c'");
    CHECK_FAIL(dg_einsum("bhr,hdr->bhd", &x, &y, &zf, NULL), DG_ERR_DTYPE, "'d'");
    const dg_tensor y_t = dg_tensor_transpose(dg_tensor_3d(y.data, DG_BFLOAT16, 3, 16, 5), 1, 2);
    CHECK_FAIL(dg_einsum("bhr,hdr->bhd", &x, &y_t, &z, NULL), DG_ERR_LAYOUT, "'b'");
    const dg_tensor x_h = dg_tensor_3d(x.data, DG_BFLOAT16, 2, 2, 16);
    CHECK_FAIL(dg_einsum("bhr,hdr->bhd", &x_h, &y, &z, NULL), DG_ERR_SHAPE, "'b'");
    const dg_tensor x_r = dg_tensor_3d(x.data, DG_BFLOAT16, 2, 3, 15);
    CHECK_FAIL(dg_einsum("bhr,hdr->bhd", &x_r, &y, &z, NULL), DG_ERR_SHAPE, "'b'");
    const dg_tensor z_d = dg_tensor_3d(z.data, DG_BFLOAT16, 2, 3, 4);
    CHECK_FAIL(dg_einsum("bhr,hdr->bhd", &x, &y, &z_d, NULL), DG_ERR_SHAPE, "'d'");
    const dg_tensor z_b = dg_tensor_3d(z.data, DG_BFLOAT16, 1, 3, 5);
    CHECK_FAIL(dg_einsum("bhr,hdr->bhd", &x, &y, &z_b, NULL), DG_ERR_SHAPE, "'d'");
    const dg_tensor z_t = dg_tensor_transpose(dg_tensor_3d(z.data, DG_BFLOAT16, 2, 5, 3), 1, 2);
    CHECK_FAIL(dg_einsum("bhr,hdr->bhd", &x, &y, &z_t, NULL), DG_ERR_LAYOUT, "'d'");
    const dg_tensor z_on_y = dg_tensor_3d(y.data, DG_BFLOAT16, 2, 3, 5);
    CHECK_FAIL(dg_einsum("bhr,hdr->bhd", &x, &y, &z_on_y, NULL), DG_ERR_LAYOUT, "'d'");
    /* "bhd,hdr->bhr": x [2, 3, 5] against y [3, 5, 16] needs z [2, 3, 16]. */
    const dg_tensor x5 = dg_tensor_3d(x.data, DG_BFLOAT16, 2, 3, 5);
    CHECK_FAIL(dg_einsum("bhd,hdr->bhr", &x5, &y, &z, NULL), DG_ERR_SHAPE, "'d'");
    CHECK_FAIL(dg_einsum("bhd,hdr->bhr", &x, &y, &z, NULL), DG_ERR_SHAPE, "'b'");
    CHECK_FAIL(dg_einsum("bhd,hdr->bhr", &x5, &y, &zf, NULL), DG_ERR_DTYPE, "'d'");
    TU_CHECK(tu_unchanged(&z, sz) && tu_unchanged(&zf, szf), "failed head-form calls write nothing");
    free(sz), free(szf), free(xv), free(yv);
    tu_free(&x), tu_free(&y), tu_free(&z), tu_free(&zf);
}

/* ---- fp8_einsum ----------------------------------------------------------------------------- */

/* Scale grouping of a logical [d0, d1, d2] tensor, in blocks of 128. */
typedef enum { PER_TOKEN_LAST, PER_BLOCK_12, PER_CHANNEL_FIRST } sf_mode;

typedef struct fp8_arg {
    dg_tensor q, sf;       /* E4M3 data, FLOAT32 scales (row-major) */
    float *orig, *deq;     /* unquantized and dequantized values, row-major */
    int64_t d[3];
} fp8_arg;

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

static void sf_shape(sf_mode mode, const int64_t d[3], int64_t out[3]) {
    out[0] = mode == PER_CHANNEL_FIRST ? cdiv(d[0], 128) : d[0];
    out[1] = mode == PER_BLOCK_12 ? cdiv(d[1], 128) : d[1];
    out[2] = mode == PER_CHANNEL_FIRST ? d[2] : cdiv(d[2], 128);
}

static int64_t sf_index(sf_mode mode, const int64_t s[3], int64_t i, int64_t j, int64_t k) {
    const int64_t a = mode == PER_CHANNEL_FIRST ? i / 128 : i, b = mode == PER_BLOCK_12 ? j / 128 : j;
    const int64_t c = mode == PER_CHANNEL_FIRST ? k : k / 128;
    return (a * s[1] + b) * s[2] + c;
}

/* Quantizes random values: sf = amax / 448 per group (a power of two above it with ue8m0),
 * data = e4m3(x * (1 / sf)). */
static fp8_arg make_fp8(tu_rng *rng, sf_mode mode, int64_t d0, int64_t d1, int64_t d2, bool ue8m0) {
    fp8_arg r;
    r.d[0] = d0, r.d[1] = d1, r.d[2] = d2;
    const int64_t n = d0 * d1 * d2;
    int64_t s[3];
    sf_shape(mode, r.d, s);
    r.q = tu_alloc3(DG_FLOAT8_E4M3, d0, d1, d2);
    r.sf = tu_alloc3(DG_FLOAT32, s[0], s[1], s[2]);
    r.orig = malloc((size_t)n * sizeof(float));
    r.deq = malloc((size_t)n * sizeof(float));
    tu_fill_normal(rng, r.orig, (size_t)n, 1.0f);
    float *sf = r.sf.data;
    for (int64_t i = 0; i < s[0] * s[1] * s[2]; ++i)
        sf[i] = 1e-4f;
    for (int64_t i = 0; i < d0; ++i)
        for (int64_t j = 0; j < d1; ++j)
            for (int64_t k = 0; k < d2; ++k) {
                float *g = &sf[sf_index(mode, s, i, j, k)];
                *g = fmaxf(*g, fabsf(r.orig[(i * d1 + j) * d2 + k]));
            }
    for (int64_t i = 0; i < s[0] * s[1] * s[2]; ++i) {
        sf[i] /= 448.0f;
        if (ue8m0)
            sf[i] = ldexpf(1.0f, (int)ceilf(log2f(sf[i])));
    }
    for (int64_t i = 0; i < d0; ++i)
        for (int64_t j = 0; j < d1; ++j)
            for (int64_t k = 0; k < d2; ++k) {
                const int64_t e = (i * d1 + j) * d2 + k;
                const float scale = sf[sf_index(mode, s, i, j, k)];
                const uint8_t q = dg_float_to_e4m3(r.orig[e] * (1.0f / scale));
                ((uint8_t *)r.q.data)[e] = q;
                r.deq[e] = dg_e4m3_to_float(q) * scale; /* exact for power-of-two scales */
            }
    return r;
}

static void free_fp8(fp8_arg *a) {
    tu_free(&a->q), tu_free(&a->sf);
    free(a->orig), free(a->deq);
}

/* Packs float power-of-two scales [d0, d1, S] into INT32 [d0, d1, ceil(S/4)] (byte j = 4q + j). */
static dg_tensor pack_ue8m0(const dg_tensor *sf) {
    const int64_t s = sf->shape[2], pk = cdiv(s, 4);
    dg_tensor p = tu_alloc3(DG_INT32, sf->shape[0], sf->shape[1], pk);
    for (int64_t i = 0; i < sf->shape[0] * sf->shape[1]; ++i)
        for (int64_t k = 0; k < s; ++k) {
            uint32_t u;
            memcpy(&u, &((float *)sf->data)[i * s + k], 4);
            ((uint32_t *)p.data)[i * pk + k / 4] |= ((u >> 23) & 0xff) << (8 * (k % 4));
        }
    return p;
}

typedef enum { FORM_BHR_HDR_BHD, FORM_BHD_HDR_BHR, FORM_BHD_BHR_HDR } fp8_form;

/* z (row-major, d's logical shape) = c + the form's contraction of values x and y, in double. */
static void naive_form(fp8_form f, const fp8_arg *x, const fp8_arg *y, const float *xv, const float *yv,
                       const float *c, double *z) {
    if (f == FORM_BHR_HDR_BHD) { /* x [B, H, R], y [H, D, R] -> [B, H, D] */
        const int64_t B = x->d[0], H = x->d[1], R = x->d[2], D = y->d[1];
        for (int64_t b = 0; b < B; ++b)
            for (int64_t h = 0; h < H; ++h)
                for (int64_t d = 0; d < D; ++d) {
                    double acc = 0;
                    for (int64_t r = 0; r < R; ++r)
                        acc += (double)xv[(b * H + h) * R + r] * yv[(h * D + d) * R + r];
                    const int64_t e = (b * H + h) * D + d;
                    z[e] = acc + (c ? c[e] : 0.0);
                }
    } else if (f == FORM_BHD_HDR_BHR) { /* x [B, H, D], y [H, D, R] -> [B, H, R] */
        const int64_t B = x->d[0], H = x->d[1], D = x->d[2], R = y->d[2];
        for (int64_t b = 0; b < B; ++b)
            for (int64_t h = 0; h < H; ++h)
                for (int64_t r = 0; r < R; ++r) {
                    double acc = 0;
                    for (int64_t d = 0; d < D; ++d)
                        acc += (double)xv[(b * H + h) * D + d] * yv[(h * D + d) * R + r];
                    const int64_t e = (b * H + h) * R + r;
                    z[e] = acc + (c ? c[e] : 0.0);
                }
    } else { /* x [B, H, D], y [B, H, R] -> [H, D, R] */
        const int64_t B = x->d[0], H = x->d[1], D = x->d[2], R = y->d[2];
        for (int64_t h = 0; h < H; ++h)
            for (int64_t d = 0; d < D; ++d)
                for (int64_t r = 0; r < R; ++r) {
                    double acc = 0;
                    for (int64_t b = 0; b < B; ++b)
                        acc += (double)xv[(b * H + h) * D + d] * yv[(b * H + h) * R + r];
                    const int64_t e = (h * D + d) * R + r;
                    z[e] = acc + (c ? c[e] : 0.0);
                }
    }
}

typedef struct fp8_case {
    fp8_form form;
    int64_t b, h, dd, r;
    bool ue8m0, packed_sfa, float_out, with_c;
} fp8_case;

static void run_fp8(tu_rng *rng, fp8_case t) {
    static const char *const exprs[3] = {"bhr,hdr->bhd", "bhd,hdr->bhr", "bhd,bhr->hdr"};
    fp8_arg x, y;
    int64_t zs[3];
    int recipe[3] = {1, 128, 128};
    if (t.form == FORM_BHR_HDR_BHD) {
        x = make_fp8(rng, PER_TOKEN_LAST, t.b, t.h, t.r, t.ue8m0);
        y = make_fp8(rng, PER_BLOCK_12, t.h, t.dd, t.r, t.ue8m0);
        zs[0] = t.b, zs[1] = t.h, zs[2] = t.dd;
    } else if (t.form == FORM_BHD_HDR_BHR) {
        x = make_fp8(rng, PER_TOKEN_LAST, t.b, t.h, t.dd, t.ue8m0);
        y = make_fp8(rng, PER_BLOCK_12, t.h, t.dd, t.r, t.ue8m0);
        zs[0] = t.b, zs[1] = t.h, zs[2] = t.r;
    } else {
        x = make_fp8(rng, PER_CHANNEL_FIRST, t.b, t.h, t.dd, t.ue8m0);
        y = make_fp8(rng, PER_CHANNEL_FIRST, t.b, t.h, t.r, t.ue8m0);
        zs[0] = t.h, zs[1] = t.dd, zs[2] = t.r;
        recipe[1] = 1;
    }
    const int64_t zn = zs[0] * zs[1] * zs[2];
    dg_tensor z = tu_alloc3(t.float_out ? DG_FLOAT32 : DG_BFLOAT16, zs[0], zs[1], zs[2]);
    float *c0 = malloc((size_t)zn * sizeof(float));
    tu_fill_normal(rng, c0, (size_t)zn, 5.0f);
    for (int64_t i = 0; i < zn; ++i) {
        c0[i] = round_to(z.dtype, c0[i]);
        if (t.float_out)
            ((float *)z.data)[i] = c0[i];
        else
            ((uint16_t *)z.data)[i] = dg_float_to_bf16(c0[i]);
    }
    dg_tensor sfa = t.packed_sfa ? pack_ue8m0(&x.sf) : x.sf;
    TU_CHECK_OK(dg_fp8_einsum(exprs[t.form], &x.q, &sfa, &y.q, &y.sf, &z, t.with_c ? &z : NULL,
                              t.form == FORM_BHD_BHR_HDR ? recipe : NULL));
    double *want = malloc((size_t)zn * sizeof(double)), *exact = malloc((size_t)zn * sizeof(double));
    naive_form(t.form, &x, &y, x.deq, y.deq, t.with_c ? c0 : NULL, want);
    naive_form(t.form, &x, &y, x.orig, y.orig, t.with_c ? c0 : NULL, exact);
    float *got = tu_to_float(&z), *wantf = malloc((size_t)zn * sizeof(float)), *exactf = malloc((size_t)zn * sizeof(float));
    int bad = 0;
    for (int64_t i = 0; i < zn; ++i) {
        wantf[i] = round_to(z.dtype, want[i]);
        exactf[i] = (float)exact[i];
        bad += got[i] != wantf[i];
    }
    const double diff_deq = tu_calc_diff(got, wantf, (size_t)zn), diff_exact = tu_calc_diff(got, exactf, (size_t)zn);
    /* Power-of-two scales make every product exact: bitwise. Otherwise rounding of the
     * dequantized products may differ in the last bit of a double: near-exact. */
    if (t.ue8m0)
        TU_CHECK(bad == 0, "%s (ue8m0): %d of %lld differ from the dequantized math", exprs[t.form], bad, (long long)zn);
    TU_CHECK(diff_deq < (t.float_out ? 1e-12 : 1e-5), "%s: calc_diff vs dequantized %.3g", exprs[t.form], diff_deq);
    TU_CHECK(diff_exact < 1e-3, "%s: calc_diff vs unquantized %.3g (SPEC: < 1e-3)", exprs[t.form], diff_exact);
    if (t.packed_sfa)
        tu_free(&sfa);
    free(want), free(exact), free(got), free(wantf), free(exactf), free(c0);
    free_fp8(&x), free_fp8(&y);
    tu_free(&z);
}

static void test_fp8_errors(tu_rng *rng) {
    fp8_arg x = make_fp8(rng, PER_TOKEN_LAST, 2, 3, 200, true), y = make_fp8(rng, PER_BLOCK_12, 3, 5, 200, true);
    dg_tensor z = tu_alloc3(DG_BFLOAT16, 2, 3, 5), zf = tu_alloc3(DG_FLOAT32, 2, 3, 5);
    tu_fill_bytes(&z, 0x19), tu_fill_bytes(&zf, 0x19);
    void *sz = tu_snapshot(&z), *szf = tu_snapshot(&zf);
    const char *e = "bhr,hdr->bhd";
    TU_CHECK_OK(dg_fp8_einsum(e, &x.q, &x.sf, &y.q, &y.sf, &zf, NULL, NULL));
    tu_fill_bytes(&zf, 0x19);
    CHECK_FAIL(dg_fp8_einsum("bmk,bnk->mn", &x.q, &x.sf, &y.q, &y.sf, &z, NULL, NULL), DG_ERR_VALUE,
               "'bhr,hdr->bhd', 'bhd,hdr->bhr', 'bhd,bhr->hdr'");
    CHECK_FAIL(dg_fp8_einsum(NULL, &x.q, &x.sf, &y.q, &y.sf, &z, NULL, NULL), DG_ERR_NULL_POINTER, "expr");
    CHECK_FAIL(dg_fp8_einsum(e, &x.q, NULL, &y.q, &y.sf, &z, NULL, NULL), DG_ERR_NULL_POINTER, "sfa");
    CHECK_FAIL(dg_fp8_einsum(e, &x.q, &x.sf, &y.q, NULL, &z, NULL, NULL), DG_ERR_NULL_POINTER, "sfb");
    CHECK_FAIL(dg_fp8_einsum(e, NULL, &x.sf, &y.q, &y.sf, &z, NULL, NULL), DG_ERR_NULL_POINTER, "'a'");
    CHECK_FAIL(dg_fp8_einsum(e, &x.q, &x.sf, &y.q, &y.sf, NULL, NULL, NULL), DG_ERR_NULL_POINTER, "'d'");
    dg_tensor bad = x.q;
    bad.dtype = DG_BFLOAT16;
    CHECK_FAIL(dg_fp8_einsum(e, &bad, &x.sf, &y.q, &y.sf, &z, NULL, NULL), DG_ERR_DTYPE, "'a'");
    bad = y.q;
    bad.dtype = DG_INT8;
    CHECK_FAIL(dg_fp8_einsum(e, &x.q, &x.sf, &bad, &y.sf, &z, NULL, NULL), DG_ERR_DTYPE, "'b'");
    const dg_tensor sfa_short = dg_tensor_3d(x.sf.data, DG_FLOAT32, 2, 3, 1);
    CHECK_FAIL(dg_fp8_einsum(e, &x.q, &sfa_short, &y.q, &y.sf, &z, NULL, NULL), DG_ERR_SHAPE, "sfa");
    const dg_tensor sfb_wrong = dg_tensor_3d(y.sf.data, DG_FLOAT32, 3, 2, 2);
    CHECK_FAIL(dg_fp8_einsum(e, &x.q, &x.sf, &y.q, &sfb_wrong, &z, NULL, NULL), DG_ERR_SHAPE, "sfb");
    const dg_tensor sfa_bf = dg_tensor_3d(x.sf.data, DG_BFLOAT16, 2, 3, 2);
    CHECK_FAIL(dg_fp8_einsum(e, &x.q, &sfa_bf, &y.q, &y.sf, &z, NULL, NULL), DG_ERR_DTYPE, "sfa");
    /* Packed scales need a granularity of 1 along MN: fine for sfa, not for the block-scaled sfb. */
    dg_tensor sfb_packed = pack_ue8m0(&y.sf);
    CHECK_FAIL(dg_fp8_einsum(e, &x.q, &x.sf, &y.q, &sfb_packed, &z, NULL, NULL), DG_ERR_VALUE, "sfb");
    const int r0[3] = {1, 0, 128};
    CHECK_FAIL(dg_fp8_einsum(e, &x.q, &x.sf, &y.q, &y.sf, &z, NULL, r0), DG_ERR_VALUE, "recipe");
    const int r64[3] = {1, 128, 64};
    CHECK_FAIL(dg_fp8_einsum(e, &x.q, &x.sf, &y.q, &y.sf, &z, NULL, r64), DG_ERR_SHAPE, "sfa");
    /* Shapes of a, b, d. */
    const dg_tensor y_h = dg_tensor_3d(y.q.data, DG_FLOAT8_E4M3, 2, 5, 200);
    CHECK_FAIL(dg_fp8_einsum(e, &x.q, &x.sf, &y_h, &y.sf, &z, NULL, NULL), DG_ERR_SHAPE, "'b'");
    const dg_tensor z_bad = dg_tensor_3d(z.data, DG_BFLOAT16, 2, 3, 4);
    CHECK_FAIL(dg_fp8_einsum(e, &x.q, &x.sf, &y.q, &y.sf, &z_bad, NULL, NULL), DG_ERR_SHAPE, "'d'");
    const dg_tensor z_i = dg_tensor_3d(z.data, DG_INT32, 2, 3, 5);
    CHECK_FAIL(dg_fp8_einsum(e, &x.q, &x.sf, &y.q, &y.sf, &z_i, NULL, NULL), DG_ERR_DTYPE, "'d'");
    const dg_tensor z_t = dg_tensor_transpose(dg_tensor_3d(z.data, DG_BFLOAT16, 2, 5, 3), 1, 2);
    CHECK_FAIL(dg_fp8_einsum(e, &x.q, &x.sf, &y.q, &y.sf, &z_t, NULL, NULL), DG_ERR_LAYOUT, "'d'");
    /* An operand with no unit stride in its GEMM dimensions. */
    dg_tensor x_str = x.q;
    x_str.shape[2] = 100;
    x_str.strides[2] = 2;
    const dg_tensor sfa_1 = dg_tensor_3d(x.sf.data, DG_FLOAT32, 2, 3, 1);
    const dg_tensor y_100 = dg_tensor_3d(y.q.data, DG_FLOAT8_E4M3, 3, 5, 100);
    const dg_tensor sfb_1 = dg_tensor_3d(y.sf.data, DG_FLOAT32, 3, 1, 1);
    CHECK_FAIL(dg_fp8_einsum(e, &x_str, &sfa_1, &y_100, &sfb_1, &z, NULL, NULL), DG_ERR_LAYOUT, "'a'");
    /* C: dtype, shape, overlap. */
    CHECK_FAIL(dg_fp8_einsum(e, &x.q, &x.sf, &y.q, &y.sf, &z, &zf, NULL), DG_ERR_DTYPE, "'c'");
    const dg_tensor c_small = dg_tensor_3d(zf.data, DG_FLOAT32, 2, 3, 4);
    CHECK_FAIL(dg_fp8_einsum(e, &x.q, &x.sf, &y.q, &y.sf, &zf, &c_small, NULL), DG_ERR_SHAPE, "'c'");
    const dg_tensor c_shift = dg_tensor_3d((float *)zf.data + 1, DG_FLOAT32, 2, 3, 5);
    CHECK_FAIL(dg_fp8_einsum(e, &x.q, &x.sf, &y.q, &y.sf, &zf, &c_shift, NULL), DG_ERR_LAYOUT, "'c'");
    const dg_tensor z_on_sfb = dg_tensor_3d(y.sf.data, DG_FLOAT32, 2, 3, 1);
    const dg_tensor y_1 = dg_tensor_3d(y.q.data, DG_FLOAT8_E4M3, 3, 1, 200);
    const dg_tensor sfb_y1 = dg_tensor_3d(y.sf.data, DG_FLOAT32, 3, 1, 2);
    CHECK_FAIL(dg_fp8_einsum(e, &x.q, &x.sf, &y_1, &sfb_y1, &z_on_sfb, NULL, NULL), DG_ERR_LAYOUT, "'d'");
    TU_CHECK(tu_unchanged(&z, sz) && tu_unchanged(&zf, szf), "failed fp8 einsum calls write nothing");
    free(sz), free(szf);
    tu_free(&sfb_packed);
    free_fp8(&x), free_fp8(&y);
    tu_free(&z), tu_free(&zf);
}

int main(void) {
    tu_rng rng = {7};
    /* The bit-exact checks against double math hold for the reference backend; the engine is
     * compared with the reference in test_einsum_engine.c. Argument checks run on both. */
    TU_CHECK_OK(dg_set_backend(DG_BACKEND_REFERENCE));
    test_bmk_bnk_mn(&rng);
    run_heads(&rng, true, 3, 2, 40, 5, 0);
    run_heads(&rng, true, 1, 3, 129, 17, 3);
    run_heads(&rng, false, 3, 2, 40, 5, 0);
    run_heads(&rng, false, 2, 3, 21, 130, 2);
    test_heads_errors(&rng);
    const fp8_case fp8_cases[] = {
        {FORM_BHR_HDR_BHD, 3, 2, 130, 200, true, false, false, false},
        {FORM_BHR_HDR_BHD, 3, 2, 130, 200, true, true, true, true},
        {FORM_BHR_HDR_BHD, 1, 3, 20, 300, false, false, true, false},
        {FORM_BHR_HDR_BHD, 2, 2, 9, 140, false, false, false, true},
        {FORM_BHD_HDR_BHR, 2, 2, 260, 140, true, false, false, false},
        {FORM_BHD_HDR_BHR, 2, 2, 150, 33, true, true, true, true},
        {FORM_BHD_HDR_BHR, 1, 1, 100, 7, false, false, true, false},
        {FORM_BHD_BHR_HDR, 150, 2, 6, 10, true, false, true, true},
        {FORM_BHD_BHR_HDR, 130, 3, 5, 4, false, false, true, false},
        {FORM_BHD_BHR_HDR, 129, 2, 3, 8, true, false, false, false},
    };
    for (size_t i = 0; i < sizeof fp8_cases / sizeof fp8_cases[0]; ++i)
        run_fp8(&rng, fp8_cases[i]);
    test_fp8_errors(&rng);
    TU_CHECK_OK(dg_set_backend(DG_BACKEND_AUTO));
    test_heads_errors(&rng);
    test_fp8_errors(&rng);
    return tu_finish();
}
