/*
 * test_quant.c - the quantization helpers (SPEC 2) against naive formulas written here:
 * per-group amax, clamp at float(1e-4), sf = amax / 448 (or / 6), optional power-of-two ceil
 * computed with frexp, data = cast(x * (1/sf)); plus UE8M0 packing, FP4 dequantization and
 * transposition, element-wise ceil, calc_diff, query forms and bad arguments.
 */
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Smallest power of two >= x for positive finite x, exponent clamped to [2^-126, 2^127]. */
static float naive_ceil_pow2(float x) {
    int e;
    const float m = frexpf(x, &e); /* x = m * 2^e, m in [0.5, 1) */
    if (m == 0.5f)
        --e;
    if (e < -126)
        e = -126;
    if (e > 127)
        e = 127;
    return ldexpf(1.0f, e);
}

static float naive_scale(float amax, float fmt_max, int ue8m0) {
    if (amax < 1e-4f)
        amax = 1e-4f;
    const float sf = amax / fmt_max;
    return ue8m0 ? naive_ceil_pow2(sf) : sf;
}

/* Scales of a row-major float matrix [m, k] for bm x bk blocks: sf [ceil(m/bm), ceil(k/bk)]. */
static float *naive_block_scales(const float *x, int64_t m, int64_t k, int64_t bm, int64_t bk, float fmt_max,
                                 int ue8m0) {
    const int64_t sm = (m + bm - 1) / bm, sk = (k + bk - 1) / bk;
    float *sf = calloc((size_t)(sm * sk + 1), sizeof(float));
    for (int64_t a = 0; a < sm; ++a)
        for (int64_t b = 0; b < sk; ++b) {
            float amax = 0;
            for (int64_t i = a * bm; i < m && i < (a + 1) * bm; ++i)
                for (int64_t j = b * bk; j < k && j < (b + 1) * bk; ++j)
                    amax = fmaxf(amax, fabsf(x[i * k + j]));
            sf[a * sk + b] = naive_scale(amax, fmt_max, ue8m0);
        }
    return sf;
}

/* An [m, k] input in the given dtype, optionally as a transposed view of a [k, m] buffer. */
static dg_tensor make_input(tu_rng *r, dg_dtype dt, int64_t m, int64_t k, int transposed, float **xf) {
    dg_tensor t = transposed ? dg_tensor_transpose(tu_alloc2(dt, k, m), 0, 1) : tu_alloc2(dt, m, k);
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < k; ++j) {
            float v = (float)(tu_normal(r) * (1 + (i % 3) * 10) * (j % 7 == 0 ? 50 : 1));
            if ((i + j) % 97 == 5)
                v = 0; /* zeros, and whole zero groups below */
            char *p = (char *)t.data + (i * t.strides[0] + j * t.strides[1]) * (int64_t)dg_dtype_size(dt);
            if (dt == DG_FLOAT32)
                *(float *)p = v;
            else
                *(uint16_t *)p = dg_float_to_bf16(v);
        }
    *xf = tu_to_float(&t);
    return t;
}

static void free_input(dg_tensor *t) { tu_free(t); /* data is the buffer start either way */ }

/* ---- FP8 helpers ----------------------------------------------------------------------------- */

typedef enum { PER_TOKEN, PER_BLOCK, PER_CHANNEL } fp8_kind;

static void check_fp8(fp8_kind kind, int64_t m, int64_t k, int g, int ue8m0, dg_dtype dt, int transposed,
                      int packed) {
    tu_rng r = {(uint64_t)(m * 1000 + k * 10 + g + ue8m0)};
    float *xf;
    dg_tensor x = make_input(&r, dt, m, k, transposed, &xf);
    const int64_t bm = kind == PER_TOKEN ? 1 : g, bk = kind == PER_CHANNEL ? 1 : g;
    float *sf = naive_block_scales(xf, m, k, bm, bk, 448.0f, ue8m0);
    const int64_t sm = (m + bm - 1) / bm, sk = (k + bk - 1) / bk;
    dg_tensor out = {0}, osf = {0};
    out.data = NULL;
    osf.data = NULL;
    dg_status st;
    if (kind == PER_TOKEN)
        st = dg_per_token_cast_to_fp8(&x, ue8m0, g, packed, &out, &osf); /* query */
    else if (kind == PER_BLOCK)
        st = dg_per_block_cast_to_fp8(&x, ue8m0, g, &out, &osf);
    else
        st = dg_per_channel_cast_to_fp8(&x, ue8m0, g, &out, &osf);
    TU_CHECK(st == DG_OK && out.dtype == DG_FLOAT8_E4M3 && out.shape[0] == m && out.shape[1] == k, "query out");
    TU_CHECK(osf.dtype == (packed ? DG_INT32 : DG_FLOAT32) && osf.shape[0] == sm &&
                 osf.shape[1] == (packed ? (sk + 3) / 4 : sk), "query out_sf (kind %d)", kind);
    out = tu_alloc2(DG_FLOAT8_E4M3, m, k);
    osf = tu_alloc2(packed ? DG_INT32 : DG_FLOAT32, sm, packed ? (sk + 3) / 4 : sk);
    if (kind == PER_TOKEN)
        st = dg_per_token_cast_to_fp8(&x, ue8m0, g, packed, &out, &osf);
    else if (kind == PER_BLOCK)
        st = dg_per_block_cast_to_fp8(&x, ue8m0, g, &out, &osf);
    else
        st = dg_per_channel_cast_to_fp8(&x, ue8m0, g, &out, &osf);
    TU_CHECK(st == DG_OK, "fp8 kind %d: %s", kind, dg_last_error());
    long long bad = 0;
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < k; ++j) {
            const float inv = 1.0f / sf[(i / bm) * sk + j / bk];
            bad += ((uint8_t *)out.data)[i * k + j] != dg_float_to_e4m3(xf[i * k + j] * inv);
        }
    const int64_t words = (sk + 3) / 4;
    for (int64_t a = 0; a < sm; ++a)
        for (int64_t b = 0; b < (packed ? 4 * words : sk); ++b) {
            const float want = b < sk ? sf[a * sk + b] : 1.0f; /* packed: the last word padded with 1.0 */
            if (!packed)
                bad += f2u(((float *)osf.data)[a * sk + b]) != f2u(want);
            else
                bad += ((((uint32_t *)osf.data)[a * words + b / 4] >> (8 * (b % 4))) & 0xff) != (f2u(want) >> 23);
        }
    TU_CHECK(bad == 0, "fp8 kind %d m %lld k %lld g %d ue8m0 %d %s%s packed %d: %lld mismatches", kind,
             (long long)m, (long long)k, g, ue8m0, dg_dtype_name(dt), transposed ? " (transposed)" : "", packed,
             bad);
    free(xf);
    free(sf);
    free_input(&x);
    tu_free(&out);
    tu_free(&osf);
}

static void test_fp8_helpers(void) {
    static const int64_t kShapes[][3] = {{1, 128, 128}, {3, 300, 128}, {5, 70, 32}, {2, 7, 4}, {130, 200, 64}, {1, 1, 8}};
    for (size_t s = 0; s < sizeof kShapes / sizeof kShapes[0]; ++s)
        for (int ue = 0; ue < 2; ++ue)
            for (int dt = 0; dt < 2; ++dt) {
                const int64_t m = kShapes[s][0], k = kShapes[s][1];
                const int g = (int)kShapes[s][2];
                const dg_dtype d = dt ? DG_BFLOAT16 : DG_FLOAT32;
                check_fp8(PER_TOKEN, m, k, g, ue, d, s % 2, 0);
                check_fp8(PER_BLOCK, m, k, g, ue, d, (s + 1) % 2, 0);
                if (m % g == 0)
                    check_fp8(PER_CHANNEL, m, k, g, ue, d, s % 2, 0);
            }
    check_fp8(PER_CHANNEL, 256, 3, 128, 1, DG_FLOAT32, 0, 0);
    check_fp8(PER_CHANNEL, 8, 5, 4, 0, DG_BFLOAT16, 1, 0);
    check_fp8(PER_TOKEN, 2, 512, 128, 1, DG_FLOAT32, 0, 1); /* packed: 4 scales -> 1 word */
    check_fp8(PER_TOKEN, 3, 250, 32, 1, DG_BFLOAT16, 1, 1); /* 8 scales with a tail */
    check_fp8(PER_TOKEN, 4, 64, 32, 1, DG_FLOAT32, 0, 1);   /* MXFP8 head dim 64: 2 scales, 2 padding bytes */
    check_fp8(PER_TOKEN, 5, 160, 32, 1, DG_BFLOAT16, 1, 1); /* 5 scales: a second, padded word */
}

/* per_custom_dims on a 3-D tensor x[a][b][c] (also one with a unit dimension). */
static void check_custom(const int64_t *shape, const int *dims, int nd, int ue8m0, int want_sf_ndim,
                         const int64_t *want_sf_shape) {
    tu_rng r = {99};
    dg_tensor x = tu_alloc(DG_FLOAT32, 3, shape);
    const int64_t n = dg_tensor_numel(&x);
    float *xf = x.data;
    for (int64_t i = 0; i < n; ++i)
        xf[i] = (float)(tu_normal(&r) * (1 + i % 5) * 3);
    int keep[3] = {0, 0, 0};
    for (int i = 0; i < nd; ++i)
        keep[dims[i]] = 1;
    if (nd == 3)
        keep[0] = keep[1] = keep[2] = 0; /* every dimension listed: one global scale, as torch */
    /* Naive: for every element, amax over all elements agreeing on the kept coordinates. */
    float *sf_of = malloc((size_t)n * sizeof(float));
    for (int64_t e = 0; e < n; ++e) {
        const int64_t ea[3] = {e / (shape[1] * shape[2]), (e / shape[2]) % shape[1], e % shape[2]};
        float amax = 0;
        for (int64_t f = 0; f < n; ++f) {
            const int64_t fa[3] = {f / (shape[1] * shape[2]), (f / shape[2]) % shape[1], f % shape[2]};
            int same = 1;
            for (int d = 0; d < 3; ++d)
                same &= !keep[d] || ea[d] == fa[d];
            if (same)
                amax = fmaxf(amax, fabsf(xf[f]));
        }
        sf_of[e] = naive_scale(amax, 448.0f, ue8m0);
    }
    dg_tensor out = {0}, osf = {0};
    TU_CHECK_OK(dg_per_custom_dims_cast_to_fp8(&x, dims, nd, ue8m0, &out, &osf));
    int shape_ok = osf.ndim == want_sf_ndim && out.ndim == 3 && out.dtype == DG_FLOAT8_E4M3;
    for (int d = 0; d < want_sf_ndim && shape_ok; ++d)
        shape_ok = osf.shape[d] == want_sf_shape[d];
    TU_CHECK(shape_ok, "custom dims query: sf ndim %d", osf.ndim);
    out = tu_alloc(DG_FLOAT8_E4M3, 3, shape);
    osf = tu_alloc(DG_FLOAT32, want_sf_ndim, want_sf_shape);
    TU_CHECK_OK(dg_per_custom_dims_cast_to_fp8(&x, dims, nd, ue8m0, &out, &osf));
    long long bad = 0;
    for (int64_t e = 0; e < n; ++e) {
        bad += ((uint8_t *)out.data)[e] != dg_float_to_e4m3(xf[e] * (1.0f / sf_of[e]));
        /* The scale's position: row-major over the kept coordinates. */
        const int64_t ea[3] = {e / (shape[1] * shape[2]), (e / shape[2]) % shape[1], e % shape[2]};
        int64_t lin = 0;
        for (int d = 0; d < 3; ++d)
            if (keep[d])
                lin = lin * shape[d] + ea[d];
        bad += f2u(((float *)osf.data)[lin]) != f2u(sf_of[e]);
    }
    TU_CHECK(bad == 0, "custom dims (%d dims, ue8m0 %d): %lld mismatches", nd, ue8m0, bad);
    free(sf_of);
    tu_free(&x);
    tu_free(&out);
    tu_free(&osf);
}

/* The indexer's per-row cast (per_custom_dims_cast_to_fp8(x, (0,)) on [T * heads, D], and (0, 1)
 * on [T, heads, D]): rows of one scale, on the fast per-token kernels for contiguous rows and on
 * the reference walk for transposed ones, bitwise the naive per-row cast either way. */
static void check_custom_rows(int64_t t, int64_t h, int64_t d, dg_dtype dt, int ue8m0, int transposed) {
    tu_rng r = {(uint64_t)(t * 7 + d + dt)};
    float *xf;
    const int64_t m = t * h;
    dg_tensor x = make_input(&r, dt, m, d, transposed, &xf);
    float *want = naive_block_scales(xf, m, d, 1, (int)d, 448.0f, ue8m0);
    const int64_t sf_shape[1] = {m};
    dg_tensor out = tu_alloc2(DG_FLOAT8_E4M3, m, d);
    dg_tensor osf = tu_alloc(DG_FLOAT32, m == 1 ? 0 : 1, sf_shape); /* DeepGEMM's sf.squeeze() */
    const int dims[2] = {0, 1};
    if (!transposed && h > 1) { /* the 3-D form: [t, h, d] with both leading dimensions kept */
        dg_tensor x3 = x, o3 = out, s2 = osf;
        x3.ndim = o3.ndim = 3, s2.ndim = 2;
        x3.shape[0] = o3.shape[0] = s2.shape[0] = t, x3.shape[1] = o3.shape[1] = s2.shape[1] = h;
        x3.shape[2] = o3.shape[2] = d;
        x3.strides[0] = h * d, x3.strides[1] = d, x3.strides[2] = 1;
        o3.strides[0] = h * d, o3.strides[1] = d, o3.strides[2] = 1;
        s2.strides[0] = h, s2.strides[1] = 1;
        TU_CHECK_OK(dg_per_custom_dims_cast_to_fp8(&x3, dims, 2, ue8m0, &o3, &s2));
    } else {
        TU_CHECK_OK(dg_per_custom_dims_cast_to_fp8(&x, dims, 1, ue8m0, &out, &osf));
    }
    long long bad = 0;
    for (int64_t i = 0; i < m; ++i) {
        bad += f2u(((const float *)osf.data)[i]) != f2u(want[i]);
        for (int64_t j = 0; j < d; ++j)
            bad += ((const uint8_t *)out.data)[i * d + j] != dg_float_to_e4m3(xf[i * d + j] * (1.0f / want[i]));
    }
    TU_CHECK(bad == 0, "custom dims rows %lldx%lldx%lld %s ue8m0 %d%s: %lld mismatches", (long long)t, (long long)h,
             (long long)d, dg_dtype_name(dt), ue8m0, transposed ? " transposed" : "", bad);
    free(want);
    free(xf);
    free_input(&x);
    tu_free(&out);
    tu_free(&osf);
}

static void test_custom_dims(void) {
    for (int ue = 0; ue < 2; ++ue) {
        check_custom_rows(33, 8, 128, DG_BFLOAT16, ue, 0);
        check_custom_rows(33, 8, 128, DG_FLOAT32, ue, 0);
        check_custom_rows(65, 64, 128, DG_BFLOAT16, ue, 0); /* enough work for the threads */
        check_custom_rows(1, 1, 128, DG_FLOAT32, ue, 0);
        check_custom_rows(40, 1, 96, DG_FLOAT32, ue, 1);
        check_custom_rows(17, 1, 33, DG_BFLOAT16, ue, 0);
    }
    const int64_t s345[3] = {3, 4, 5}, s315[3] = {3, 1, 5};
    const int d0[1] = {0}, d12[2] = {1, 2}, d2[1] = {2}, d012[3] = {0, 1, 2}, d01[2] = {0, 1};
    const int64_t sh3[1] = {3}, sh45[2] = {4, 5}, sh5[1] = {5};
    for (int ue = 0; ue < 2; ++ue) {
        check_custom(s345, d0, 1, ue, 1, sh3);
        check_custom(s345, d12, 2, ue, 2, sh45);
        check_custom(s345, d2, 1, ue, 1, sh5);
        check_custom(s345, NULL, 0, ue, 0, NULL); /* nothing listed: global */
        check_custom(s345, d012, 3, ue, 0, NULL); /* everything listed: global too */
        check_custom(s315, d01, 2, ue, 1, sh3);   /* squeeze drops the unit dimension */
    }
}

/* ---- FP4 ------------------------------------------------------------------------------------- */

static void check_fp4(int64_t m, int64_t k, int g, int ue8m0, int packed, dg_dtype dt, int transposed) {
    tu_rng r = {(uint64_t)(m * 31 + k)};
    float *xf;
    dg_tensor x = make_input(&r, dt, m, k, transposed, &xf);
    float *sf = naive_block_scales(xf, m, k, 1, g, 6.0f, ue8m0);
    const int64_t sk = (k + g - 1) / g, words = (sk + 3) / 4;
    dg_tensor out = {0}, osf = {0};
    TU_CHECK_OK(dg_per_token_cast_to_fp4(&x, ue8m0, g, packed, &out, &osf));
    TU_CHECK(out.dtype == DG_FP4_E2M1X2 && out.shape[0] == m && out.shape[1] == k / 2 &&
                 osf.shape[1] == (packed ? words : sk), "fp4 query");
    out = tu_alloc2(DG_FP4_E2M1X2, m, k / 2);
    osf = tu_alloc2(packed ? DG_INT32 : DG_FLOAT32, m, packed ? words : sk);
    TU_CHECK_OK(dg_per_token_cast_to_fp4(&x, ue8m0, g, packed, &out, &osf));
    long long bad = 0;
    float *back = malloc((size_t)(m * k) * sizeof(float));
    for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < k; ++j) {
            const float s = sf[i * sk + j / g];
            const uint8_t want = dg_float_to_e2m1(xf[i * k + j] * (1.0f / s));
            const uint8_t byte = ((uint8_t *)out.data)[i * (k / 2) + j / 2];
            bad += ((j & 1) ? byte >> 4 : byte & 15) != want;
            const float mag = dg_e2m1_to_float(want & 7);
            back[i * k + j] = ((want & 8) ? -mag : mag) * s;
        }
        for (int64_t q = 0; q < (packed ? words * 4 : sk); ++q) {
            if (!packed) {
                bad += f2u(((float *)osf.data)[i * sk + q]) != f2u(sf[i * sk + q]);
                continue;
            }
            const uint32_t byte = (((uint32_t *)osf.data)[i * words + q / 4] >> (8 * (q % 4))) & 0xff;
            bad += byte != (q < sk ? f2u(sf[i * sk + q]) >> 23 : 127u); /* padding scales are 1.0 */
        }
    }
    TU_CHECK(bad == 0, "fp4 m %lld k %lld g %d ue8m0 %d packed %d: %lld mismatches", (long long)m, (long long)k, g,
             ue8m0, packed, bad);
    /* And back: cast_back_from_fp4 gives value * scale exactly. */
    dg_tensor y = {0};
    TU_CHECK_OK(dg_cast_back_from_fp4(&out, &osf, g, packed, &y));
    TU_CHECK(y.dtype == DG_FLOAT32 && y.shape[0] == m && y.shape[1] == k, "cast_back query");
    y = tu_alloc2(DG_FLOAT32, m, k);
    TU_CHECK_OK(dg_cast_back_from_fp4(&out, &osf, g, packed, &y));
    bad = 0;
    for (int64_t e = 0; e < m * k; ++e)
        bad += f2u(((float *)y.data)[e]) != f2u(back[e]);
    TU_CHECK(bad == 0, "cast_back m %lld k %lld: %lld mismatches", (long long)m, (long long)k, bad);
    free(back);
    free(xf);
    free(sf);
    free_input(&x);
    tu_free(&out);
    tu_free(&osf);
    tu_free(&y);
}

static void test_fp4(void) {
    for (int ue = 0; ue < 2; ++ue) {
        check_fp4(2, 64, 32, ue, 0, DG_FLOAT32, 0);
        check_fp4(3, 100, 32, ue, 0, DG_BFLOAT16, 1);
        check_fp4(1, 256, 128, ue, 0, DG_FLOAT32, 0);
    }
    check_fp4(2, 64, 32, 1, 1, DG_FLOAT32, 0);   /* 2 scales padded to a word */
    check_fp4(4, 300, 32, 1, 1, DG_BFLOAT16, 1); /* 10 scales: 3 words, tail */
    check_fp4(1, 2, 128, 1, 1, DG_FLOAT32, 0);
    /* Code 8 (-0) dequantizes to +0; byte 0 of a packed scale gives the float 0. */
    uint8_t pk[2] = {0x98, 0x0f};
    int32_t ps[1] = {0x00007f80}; /* scales 2^1 (byte 0x80), 2^0 (0x7f), then bytes 0, 0 */
    float y[4];
    dg_tensor tp = dg_tensor_2d(pk, DG_INT8, 1, 2), ts = dg_tensor_2d(ps, DG_INT32, 1, 1),
              ty = dg_tensor_2d(y, DG_FLOAT32, 1, 4);
    TU_CHECK_OK(dg_cast_back_from_fp4(&tp, &ts, 1, 1, &ty));
    /* codes 8, 9, 15, 0 with gran_k 1: +0 * 2, -0.5 * 1, -6 * 0 = -0, 0 * 0 */
    TU_CHECK(f2u(y[0]) == 0 && y[1] == -0.5f && f2u(y[2]) == 0x80000000u && f2u(y[3]) == 0, "cast_back codes: %g %g %g %g",
             y[0], y[1], y[2], y[3]);
}

/* ---- packing, transpose, ceil, calc_diff ------------------------------------------------------ */

static void test_pack_transpose(void) {
    float sf[2][8];
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 8; ++j)
            sf[i][j] = ldexpf(1.0f, i * 8 + j - 7);
    sf[1][7] = 0.0f;
    sf[1][6] = INFINITY;
    dg_tensor x = dg_tensor_2d(sf, DG_FLOAT32, 2, 8), out = {0};
    TU_CHECK_OK(dg_pack_ue8m0_to_int(&x, &out));
    TU_CHECK(out.dtype == DG_INT32 && out.shape[0] == 2 && out.shape[1] == 2, "pack query");
    int32_t pk[2][2];
    out = dg_tensor_2d(pk, DG_INT32, 2, 2);
    TU_CHECK_OK(dg_pack_ue8m0_to_int(&x, &out));
    int bad = 0;
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 8; ++j)
            bad += (((uint32_t)pk[i][j / 4] >> (8 * (j % 4))) & 0xff) != (f2u(sf[i][j]) >> 23);
    TU_CHECK(bad == 0, "pack bytes");
    float un[2][8];
    dg_tensor u = {0};
    TU_CHECK_OK(dg_unpack_ue8m0_from_int(&out, &u));
    TU_CHECK(u.shape[1] == 8 && u.dtype == DG_FLOAT32, "unpack query");
    u = dg_tensor_2d(un, DG_FLOAT32, 2, 8);
    TU_CHECK_OK(dg_unpack_ue8m0_from_int(&out, &u));
    TU_CHECK(memcmp(un, sf, sizeof sf) == 0, "unpack inverts pack (0 and inf included)");
    /* Packing a transposed (MN-major) view: row i of xt is column i of the [4, 4] buffer. */
    dg_tensor xt = dg_tensor_transpose(dg_tensor_2d(sf, DG_FLOAT32, 4, 4), 0, 1);
    int32_t pt[4];
    dg_tensor ot = dg_tensor_2d(pt, DG_INT32, 4, 1);
    TU_CHECK_OK(dg_pack_ue8m0_to_int(&xt, &ot));
    TU_CHECK((((uint32_t)pt[1] >> 8) & 0xff) == f2u(sf[0][5]) >> 23, "pack strided");

    /* transpose_packed_fp4: logical [4, 6] -> [6, 4]. */
    uint8_t a[4][3], t[6][2];
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 3; ++j)
            a[i][j] = (uint8_t)(i * 53 + j * 17 + 3);
    dg_tensor ta = dg_tensor_2d(a, DG_FP4_E2M1X2, 4, 3), tt = {0};
    TU_CHECK_OK(dg_transpose_packed_fp4(&ta, &tt));
    TU_CHECK(tt.shape[0] == 6 && tt.shape[1] == 2 && tt.dtype == DG_FP4_E2M1X2, "transpose query");
    tt = dg_tensor_2d(t, DG_FP4_E2M1X2, 6, 2);
    TU_CHECK_OK(dg_transpose_packed_fp4(&ta, &tt));
    bad = 0;
    for (int r = 0; r < 4; ++r)
        for (int c = 0; c < 6; ++c) {
            const int ca = (c & 1) ? a[r][c / 2] >> 4 : a[r][c / 2] & 15;
            const int ct = (r & 1) ? t[c][r / 2] >> 4 : t[c][r / 2] & 15;
            bad += ca != ct;
        }
    TU_CHECK(bad == 0, "transpose codes");
}

static void test_ceil_and_diff(void) {
    float v[6] = {3.0f, -0.5f, 0.0f, 1e-40f, 3e38f, 0.75f}, o[6];
    dg_tensor x = dg_tensor_2d(v, DG_FLOAT32, 2, 3), y = dg_tensor_2d(o, DG_FLOAT32, 2, 3);
    TU_CHECK_OK(dg_ceil_to_ue8m0_tensor(&x, &y));
    int bad = 0;
    for (int i = 0; i < 6; ++i)
        bad += f2u(o[i]) != f2u(naive_ceil_pow2(fabsf(v[i]) > 0 ? fabsf(v[i]) : 1e-45f));
    TU_CHECK(bad == 0 && o[0] == 4.0f && o[1] == 0.5f, "ceil tensor");
    TU_CHECK_OK(dg_ceil_to_ue8m0_tensor(&x, &x)); /* in place */
    TU_CHECK(memcmp(v, o, sizeof o) == 0, "ceil in place");

    tu_rng r = {5};
    enum { N = 257 };
    float a[N], b[N];
    tu_fill_normal(&r, a, N, 1.0f);
    for (int i = 0; i < N; ++i)
        b[i] = a[i] + (float)(tu_normal(&r) * 0.01);
    dg_tensor ta = dg_tensor_1d(a, DG_FLOAT32, N), tb = dg_tensor_1d(b, DG_FLOAT32, N);
    double d = -1;
    TU_CHECK_OK(dg_calc_diff(&ta, &tb, &d));
    TU_CHECK(fabs(d - tu_calc_diff(a, b, N)) < 1e-15 && d > 0, "calc_diff %g", d);
    /* BF16 (a transposed view) against float32. */
    uint16_t hb[12];
    float fb[12], hf[12];
    for (int i = 0; i < 12; ++i) {
        fb[i] = a[i];
        hb[i] = dg_float_to_bf16(a[i] * 1.01f);
    }
    for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 4; ++j)
            hf[i * 4 + j] = dg_bf16_to_float(hb[j * 3 + i]);
    dg_tensor th = dg_tensor_transpose(dg_tensor_2d(hb, DG_BFLOAT16, 4, 3), 0, 1);
    dg_tensor tf = dg_tensor_2d(fb, DG_FLOAT32, 3, 4);
    TU_CHECK_OK(dg_calc_diff(&tf, &th, &d));
    TU_CHECK(fabs(d - tu_calc_diff(fb, hf, 12)) < 1e-15, "calc_diff bf16 strided %g", d);
    float z[4] = {0, 0, 0, 0};
    dg_tensor tz = dg_tensor_1d(z, DG_FLOAT32, 4);
    TU_CHECK(dg_calc_diff(&tz, &tz, &d) == DG_OK && d == 0.0, "calc_diff of zeros");
    dg_tensor te = dg_tensor_1d(NULL, DG_FLOAT32, 0);
    TU_CHECK(dg_calc_diff(&te, &te, &d) == DG_OK && d == 0.0, "calc_diff of empty");
}

/* ---- bad arguments: each returns its status, names the argument, writes nothing ------------ */

#define EXPECT_FAIL(call, status, fn, arg)                                                              \
    do {                                                                                                \
        TU_CHECK_STATUS(call, status);                                                                  \
        TU_CHECK(strstr(dg_last_error(), fn) != NULL && strstr(dg_last_error(), "'" arg "'") != NULL,   \
                 "message names %s and '%s': %s", fn, arg, dg_last_error());                            \
    } while (0)

static void test_bad_fp8(void) {
    float xb[4 * 256];
    for (int i = 0; i < 4 * 256; ++i)
        xb[i] = (float)(i % 13) - 6.0f;
    dg_tensor x = dg_tensor_2d(xb, DG_FLOAT32, 4, 256);
    dg_tensor out = tu_alloc2(DG_FLOAT8_E4M3, 4, 256), sf = tu_alloc2(DG_FLOAT32, 4, 2);
    tu_fill_bytes(&out, 0x5a);
    tu_fill_bytes(&sf, 0x5a);
    void *so = tu_snapshot(&out), *ss = tu_snapshot(&sf);
    const char *f = "dg_per_token_cast_to_fp8";
    int32_t ib[8];
    dg_tensor xi = dg_tensor_2d(ib, DG_INT32, 2, 4), x3 = dg_tensor_3d(xb, DG_FLOAT32, 2, 2, 256);
    EXPECT_FAIL(dg_per_token_cast_to_fp8(NULL, 0, 128, 0, &out, &sf), DG_ERR_NULL_POINTER, f, "x");
    EXPECT_FAIL(dg_per_token_cast_to_fp8(&xi, 0, 128, 0, &out, &sf), DG_ERR_DTYPE, f, "x");
    EXPECT_FAIL(dg_per_token_cast_to_fp8(&x3, 0, 128, 0, &out, &sf), DG_ERR_SHAPE, f, "x");
    EXPECT_FAIL(dg_per_token_cast_to_fp8(&x, 0, 0, 0, &out, &sf), DG_ERR_VALUE, f, "gran_k");
    EXPECT_FAIL(dg_per_token_cast_to_fp8(&x, 0, 128, 1, &out, &sf), DG_ERR_VALUE, f, "use_packed_ue8m0");
    EXPECT_FAIL(dg_per_token_cast_to_fp8(&x, 0, 128, 0, NULL, &sf), DG_ERR_NULL_POINTER, f, "out");
    EXPECT_FAIL(dg_per_token_cast_to_fp8(&x, 0, 128, 0, &out, NULL), DG_ERR_NULL_POINTER, f, "out_sf");
    EXPECT_FAIL(dg_per_token_cast_to_fp8(&x, 0, 64, 0, &out, &sf), DG_ERR_SHAPE, f, "out_sf");
    dg_tensor o2 = out;
    o2.shape[1] = 255;
    EXPECT_FAIL(dg_per_token_cast_to_fp8(&x, 0, 128, 0, &o2, &sf), DG_ERR_SHAPE, f, "out");
    o2 = out;
    o2.dtype = DG_UINT8;
    EXPECT_FAIL(dg_per_token_cast_to_fp8(&x, 0, 128, 0, &o2, &sf), DG_ERR_DTYPE, f, "out");
    o2 = out;
    o2.strides[0] = 0;
    EXPECT_FAIL(dg_per_token_cast_to_fp8(&x, 0, 128, 0, &o2, &sf), DG_ERR_LAYOUT, f, "out");
    dg_tensor s2 = sf;
    s2.dtype = DG_INT32;
    EXPECT_FAIL(dg_per_token_cast_to_fp8(&x, 0, 128, 0, &out, &s2), DG_ERR_DTYPE, f, "out_sf");
    dg_tensor alias = dg_tensor_2d(xb, DG_FLOAT8_E4M3, 4, 256); /* out over x's bytes */
    float xcopy[4 * 256];
    memcpy(xcopy, xb, sizeof xb);
    EXPECT_FAIL(dg_per_token_cast_to_fp8(&x, 0, 128, 0, &alias, &sf), DG_ERR_LAYOUT, f, "out");
    dg_tensor sf_in_out = dg_tensor_2d(out.data, DG_FLOAT32, 4, 2);
    EXPECT_FAIL(dg_per_token_cast_to_fp8(&x, 0, 128, 0, &out, &sf_in_out), DG_ERR_LAYOUT, f, "out_sf");
    TU_CHECK(memcmp(xcopy, xb, sizeof xb) == 0, "x untouched");

    f = "dg_per_block_cast_to_fp8";
    EXPECT_FAIL(dg_per_block_cast_to_fp8(&x, 0, -1, &out, &sf), DG_ERR_VALUE, f, "gran_k");
    EXPECT_FAIL(dg_per_block_cast_to_fp8(&x, 0, 128, &out, &sf), DG_ERR_SHAPE, f, "out_sf"); /* wants [1, 2] */
    EXPECT_FAIL(dg_per_block_cast_to_fp8(NULL, 0, 128, &out, &sf), DG_ERR_NULL_POINTER, f, "x");
    f = "dg_per_channel_cast_to_fp8";
    EXPECT_FAIL(dg_per_channel_cast_to_fp8(&x, 0, 128, &out, &sf), DG_ERR_SHAPE, f, "x"); /* 4 % 128 */
    EXPECT_FAIL(dg_per_channel_cast_to_fp8(&x, 0, 2, &out, &sf), DG_ERR_SHAPE, f, "out_sf");

    f = "dg_per_custom_dims_cast_to_fp8";
    const int dbad[2] = {0, 2}, ddup[2] = {1, 1}, d0[1] = {0};
    EXPECT_FAIL(dg_per_custom_dims_cast_to_fp8(&x, NULL, 1, 0, &out, &sf), DG_ERR_NULL_POINTER, f, "dims");
    EXPECT_FAIL(dg_per_custom_dims_cast_to_fp8(&x, dbad, 2, 0, &out, &sf), DG_ERR_VALUE, f, "dims");
    EXPECT_FAIL(dg_per_custom_dims_cast_to_fp8(&x, ddup, 2, 0, &out, &sf), DG_ERR_VALUE, f, "dims");
    EXPECT_FAIL(dg_per_custom_dims_cast_to_fp8(&x, d0, -1, 0, &out, &sf), DG_ERR_VALUE, f, "num_dims");
    EXPECT_FAIL(dg_per_custom_dims_cast_to_fp8(&x, d0, 1, 0, &out, &sf), DG_ERR_SHAPE, f, "out_sf");
    dg_tensor xe = dg_tensor_2d(xb, DG_FLOAT32, 4, 0);
    EXPECT_FAIL(dg_per_custom_dims_cast_to_fp8(&xe, d0, 1, 0, &out, &sf), DG_ERR_SHAPE, f, "x");
    TU_CHECK(tu_unchanged(&out, so) && tu_unchanged(&sf, ss), "fp8 outputs untouched by failed calls");
    free(so);
    free(ss);
    tu_free(&out);
    tu_free(&sf);
}

static void test_bad_fp4_and_utils(void) {
    float xb[2 * 64];
    for (int i = 0; i < 128; ++i)
        xb[i] = (float)(i % 9) - 4.0f;
    dg_tensor x = dg_tensor_2d(xb, DG_FLOAT32, 2, 64);
    dg_tensor out = tu_alloc2(DG_FP4_E2M1X2, 2, 32), sf = tu_alloc2(DG_FLOAT32, 2, 2);
    tu_fill_bytes(&out, 0x77);
    tu_fill_bytes(&sf, 0x77);
    void *so = tu_snapshot(&out), *ss = tu_snapshot(&sf);
    const char *f = "dg_per_token_cast_to_fp4";
    dg_tensor xodd = dg_tensor_2d(xb, DG_FLOAT32, 2, 63), x2 = dg_tensor_2d(xb, DG_FLOAT32, 1, 2);
    EXPECT_FAIL(dg_per_token_cast_to_fp4(&xodd, 0, 32, 0, &out, &sf), DG_ERR_SHAPE, f, "x");
    EXPECT_FAIL(dg_per_token_cast_to_fp4(&x2, 0, 3, 0, &out, &sf), DG_ERR_VALUE, f, "gran_k");
    EXPECT_FAIL(dg_per_token_cast_to_fp4(&x, 0, 32, 1, &out, &sf), DG_ERR_VALUE, f, "use_packed_ue8m0");
    dg_tensor o2 = out;
    o2.dtype = DG_FLOAT32;
    EXPECT_FAIL(dg_per_token_cast_to_fp4(&x, 0, 32, 0, &o2, &sf), DG_ERR_DTYPE, f, "out");
    o2 = dg_tensor_transpose(dg_tensor_2d(out.data, DG_FP4_E2M1X2, 32, 2), 0, 1);
    EXPECT_FAIL(dg_per_token_cast_to_fp4(&x, 0, 32, 0, &o2, &sf), DG_ERR_LAYOUT, f, "out");
    EXPECT_FAIL(dg_per_token_cast_to_fp4(&x, 1, 32, 1, &out, &sf), DG_ERR_DTYPE, f, "out_sf"); /* wants int32 */

    f = "dg_cast_back_from_fp4";
    float yb[2 * 64];
    memset(yb, 0x33, sizeof yb);
    dg_tensor y = dg_tensor_2d(yb, DG_FLOAT32, 2, 64);
    const float ycopy0 = yb[0];
    dg_tensor sf1 = dg_tensor_2d(sf.data, DG_FLOAT32, 2, 1), sf3 = dg_tensor_2d(sf.data, DG_FLOAT32, 1, 2);
    EXPECT_FAIL(dg_cast_back_from_fp4(&out, &sf1, 32, 0, &y), DG_ERR_SHAPE, f, "sf");
    EXPECT_FAIL(dg_cast_back_from_fp4(&out, &sf3, 32, 0, &y), DG_ERR_SHAPE, f, "sf");
    EXPECT_FAIL(dg_cast_back_from_fp4(&out, &sf, 32, 1, &y), DG_ERR_DTYPE, f, "sf");
    EXPECT_FAIL(dg_cast_back_from_fp4(&x, &sf, 32, 0, &y), DG_ERR_DTYPE, f, "packed");
    EXPECT_FAIL(dg_cast_back_from_fp4(&out, &sf, 0, 0, &y), DG_ERR_VALUE, f, "gran_k");
    dg_tensor yi = dg_tensor_2d(yb, DG_INT32, 2, 64);
    EXPECT_FAIL(dg_cast_back_from_fp4(&out, &sf, 32, 0, &yi), DG_ERR_DTYPE, f, "out");
    EXPECT_FAIL(dg_cast_back_from_fp4(&out, &sf, 32, 0, NULL), DG_ERR_NULL_POINTER, f, "out");
    TU_CHECK(yb[0] == ycopy0, "cast_back output untouched");

    f = "dg_pack_ue8m0_to_int";
    float pv[8] = {1, 2, 4, 8, 0.5f, 3.0f, 1, 1};
    int32_t pw[2] = {11, 22};
    dg_tensor px = dg_tensor_2d(pv, DG_FLOAT32, 1, 8), po = dg_tensor_2d(pw, DG_INT32, 1, 2);
    EXPECT_FAIL(dg_pack_ue8m0_to_int(&px, &po), DG_ERR_VALUE, f, "x"); /* 3.0 has mantissa bits */
    pv[5] = -0.0f;
    EXPECT_FAIL(dg_pack_ue8m0_to_int(&px, &po), DG_ERR_VALUE, f, "x"); /* negative as int32 */
    pv[5] = 1.0f;
    dg_tensor px6 = dg_tensor_2d(pv, DG_FLOAT32, 1, 6), po1 = dg_tensor_2d(pw, DG_INT32, 1, 1);
    EXPECT_FAIL(dg_pack_ue8m0_to_int(&px6, &po), DG_ERR_SHAPE, f, "x");
    EXPECT_FAIL(dg_pack_ue8m0_to_int(&px, &po1), DG_ERR_SHAPE, f, "out");
    dg_tensor pxi = dg_tensor_2d(pv, DG_INT32, 1, 8);
    EXPECT_FAIL(dg_pack_ue8m0_to_int(&pxi, &po), DG_ERR_DTYPE, f, "x");
    TU_CHECK(pw[0] == 11 && pw[1] == 22, "pack output untouched");
    f = "dg_unpack_ue8m0_from_int";
    dg_tensor uo = dg_tensor_2d(pv, DG_FLOAT32, 1, 4);
    EXPECT_FAIL(dg_unpack_ue8m0_from_int(&px, &uo), DG_ERR_DTYPE, f, "packed_sf");
    EXPECT_FAIL(dg_unpack_ue8m0_from_int(&po, &uo), DG_ERR_SHAPE, f, "out");
    EXPECT_FAIL(dg_unpack_ue8m0_from_int(NULL, &uo), DG_ERR_NULL_POINTER, f, "packed_sf");
    TU_CHECK(pv[0] == 1 && pv[7] == 1, "unpack output untouched");

    f = "dg_transpose_packed_fp4";
    uint8_t ta[3][2] = {{1, 2}, {3, 4}, {5, 6}}, tb[4][2];
    memset(tb, 0x11, sizeof tb);
    dg_tensor a3 = dg_tensor_2d(ta, DG_FP4_E2M1X2, 3, 2), a2 = dg_tensor_2d(ta, DG_FP4_E2M1X2, 2, 2);
    dg_tensor tout = dg_tensor_2d(tb, DG_FP4_E2M1X2, 4, 2);
    EXPECT_FAIL(dg_transpose_packed_fp4(&a3, &tout), DG_ERR_SHAPE, f, "a");
    EXPECT_FAIL(dg_transpose_packed_fp4(&a2, &tout), DG_ERR_SHAPE, f, "out"); /* wants [4, 1] */
    dg_tensor au = dg_tensor_2d(ta, DG_UINT8, 2, 2);
    EXPECT_FAIL(dg_transpose_packed_fp4(&au, &tout), DG_ERR_DTYPE, f, "a");
    TU_CHECK(tb[0][0] == 0x11 && tb[3][1] == 0x11, "transpose output untouched");

    f = "dg_calc_diff";
    double d = 7;
    dg_tensor c1 = dg_tensor_2d(xb, DG_FLOAT32, 2, 64), c2 = dg_tensor_2d(xb, DG_FLOAT32, 64, 2);
    EXPECT_FAIL(dg_calc_diff(&c1, &c2, &d), DG_ERR_SHAPE, f, "y");
    EXPECT_FAIL(dg_calc_diff(&c1, &c1, NULL), DG_ERR_NULL_POINTER, f, "out");
    EXPECT_FAIL(dg_calc_diff(&out, &c1, &d), DG_ERR_DTYPE, f, "x");
    /* a broadcast view claiming 2^55 rows spans one row but would be read for years (fuzz_quant) */
    dg_tensor cb = dg_tensor_2d(xb, DG_FLOAT32, (int64_t)1 << 55, 33);
    cb.strides[0] = 0;
    EXPECT_FAIL(dg_calc_diff(&cb, &cb, &d), DG_ERR_OVERFLOW, f, "x");
    TU_CHECK(d == 7, "calc_diff output untouched");

    f = "dg_ceil_to_ue8m0_tensor";
    dg_tensor hb = dg_tensor_2d(yb, DG_BFLOAT16, 2, 64);
    EXPECT_FAIL(dg_ceil_to_ue8m0_tensor(&x, &hb), DG_ERR_DTYPE, f, "out");
    dg_tensor shifted = dg_tensor_2d(xb + 1, DG_FLOAT32, 2, 64); /* overlaps x, not the same view */
    shifted.shape[1] = 63;
    dg_tensor xs = dg_tensor_2d(xb, DG_FLOAT32, 2, 63);
    xs.strides[0] = 64;
    shifted.strides[0] = 64;
    EXPECT_FAIL(dg_ceil_to_ue8m0_tensor(&xs, &shifted), DG_ERR_LAYOUT, f, "out");
    TU_CHECK(xb[0] == -4.0f && xb[1] == -3.0f, "x untouched");

    TU_CHECK(tu_unchanged(&out, so) && tu_unchanged(&sf, ss), "fp4 outputs untouched by failed calls");
    free(so);
    free(ss);
    tu_free(&out);
    tu_free(&sf);
}

/* dg_cast_back_from_fp8 (DeepGEMM 2.8's cast_back_from_fp8): e4m3(x) * the scale of its group,
 * float32 or packed UE8M0 scales (the MXFP8 recipe: gran_k 32, a padded last word), strided x,
 * BF16 out, the query form, an empty x, and bad arguments that leave out untouched. */
static void test_cast_back_fp8(void) {
    tu_rng r = {77};
    for (int packed = 0; packed < 2; ++packed)
        for (int transposed = 0; transposed < 2; ++transposed) {
            const int64_t m = 5, k = 200;
            const int g = packed ? 32 : 64;
            float *xf;
            dg_tensor x = make_input(&r, DG_FLOAT32, m, k, 0, &xf);
            const int64_t s = (k + g - 1) / g, cols = packed ? (s + 3) / 4 : s;
            dg_tensor q = transposed ? dg_tensor_transpose(tu_alloc2(DG_FLOAT8_E4M3, k, m), 0, 1)
                                     : tu_alloc2(DG_FLOAT8_E4M3, m, k);
            dg_tensor sf = tu_alloc2(packed ? DG_INT32 : DG_FLOAT32, m, cols);
            TU_CHECK_OK(dg_per_token_cast_to_fp8(&x, packed, g, packed, &q, &sf));
            for (int bf16 = 0; bf16 < 2; ++bf16) {
                dg_tensor y = {0};
                TU_CHECK_OK(dg_cast_back_from_fp8(&q, &sf, g, packed, &y)); /* query */
                TU_CHECK(y.dtype == DG_FLOAT32 && y.shape[0] == m && y.shape[1] == k, "cast_back_from_fp8 query");
                y = tu_alloc2(bf16 ? DG_BFLOAT16 : DG_FLOAT32, m, k);
                TU_CHECK_OK(dg_cast_back_from_fp8(&q, &sf, g, packed, &y));
                int64_t bad = 0;
                for (int64_t i = 0; i < m; ++i)
                    for (int64_t j = 0; j < k; ++j) {
                        const int64_t grp = j / g;
                        float sc;
                        if (packed) {
                            const uint32_t w = ((uint32_t *)sf.data)[i * cols + grp / 4];
                            sc = u2f(((w >> (8 * (grp % 4))) & 0xffu) << 23);
                        } else {
                            sc = ((float *)sf.data)[i * cols + grp];
                        }
                        const uint8_t code = ((uint8_t *)q.data)[i * q.strides[0] + j * q.strides[1]];
                        const float want = dg_e4m3_to_float(code) * sc;
                        const float got =
                            bf16 ? dg_bf16_to_float(((uint16_t *)y.data)[i * k + j]) : ((float *)y.data)[i * k + j];
                        bad += bf16 ? got != dg_bf16_to_float(dg_float_to_bf16(want)) : f2u(got) != f2u(want);
                    }
                TU_CHECK(bad == 0, "cast_back_from_fp8 packed %d transposed %d bf16 %d: %lld mismatches", packed,
                         transposed, bf16, (long long)bad);
                tu_free(&y);
            }
            free(xf);
            free_input(&x);
            tu_free(&q), tu_free(&sf);
        }
    /* empty x: nothing to read or write */
    uint8_t e0[1];
    float s0[1], y0[1] = {7};
    dg_tensor eq = dg_tensor_2d(e0, DG_FLOAT8_E4M3, 0, 64), es = dg_tensor_2d(s0, DG_FLOAT32, 0, 1);
    dg_tensor ey = dg_tensor_2d(y0, DG_FLOAT32, 0, 64);
    TU_CHECK_OK(dg_cast_back_from_fp8(&eq, &es, 64, 0, &ey));
    TU_CHECK(y0[0] == 7, "empty cast_back_from_fp8 writes nothing");
    /* bad arguments */
    const char *f = "dg_cast_back_from_fp8";
    _Alignas(4) uint8_t qb[512]; /* q in the first 128 bytes; yq's views stay inside */
    float sb[4] = {1, 1, 1, 1}, yb[2 * 64];
    memset(qb, 0x38, sizeof qb);
    memset(yb, 0x33, sizeof yb);
    const float y00 = yb[0];
    dg_tensor q = dg_tensor_2d(qb, DG_FLOAT8_E4M3, 2, 64), sf = dg_tensor_2d(sb, DG_FLOAT32, 2, 2);
    dg_tensor y = dg_tensor_2d(yb, DG_FLOAT32, 2, 64);
    dg_tensor qf = dg_tensor_2d(yb, DG_FLOAT32, 2, 64), sf1 = dg_tensor_2d(sb, DG_FLOAT32, 2, 1);
    dg_tensor sfi = dg_tensor_2d(sb, DG_INT32, 2, 2), yi = dg_tensor_2d(yb, DG_INT32, 2, 64);
    dg_tensor yq = dg_tensor_2d(qb, DG_FLOAT32, 2, 32); /* overlaps q */
    EXPECT_FAIL(dg_cast_back_from_fp8(NULL, &sf, 32, 0, &y), DG_ERR_NULL_POINTER, f, "x");
    EXPECT_FAIL(dg_cast_back_from_fp8(&qf, &sf, 32, 0, &y), DG_ERR_DTYPE, f, "x");
    EXPECT_FAIL(dg_cast_back_from_fp8(&q, &sf1, 32, 0, &y), DG_ERR_SHAPE, f, "sf");
    EXPECT_FAIL(dg_cast_back_from_fp8(&q, &sf, 32, 1, &y), DG_ERR_DTYPE, f, "sf");
    EXPECT_FAIL(dg_cast_back_from_fp8(&q, &sfi, 32, 0, &y), DG_ERR_DTYPE, f, "sf");
    EXPECT_FAIL(dg_cast_back_from_fp8(&q, &sf, 0, 0, &y), DG_ERR_VALUE, f, "gran_k");
    EXPECT_FAIL(dg_cast_back_from_fp8(&q, &sf, 32, 0, &yi), DG_ERR_DTYPE, f, "out");
    dg_tensor ys = dg_tensor_2d(yb, DG_FLOAT32, 2, 63);
    EXPECT_FAIL(dg_cast_back_from_fp8(&q, &sf, 32, 0, &ys), DG_ERR_SHAPE, f, "out");
    EXPECT_FAIL(dg_cast_back_from_fp8(&q, &sf, 32, 0, &yq), DG_ERR_SHAPE, f, "out");
    yq.shape[1] = 64, yq.strides[0] = 64; /* right shape, but over q's bytes */
    yq.data = qb;
    TU_CHECK_STATUS(dg_cast_back_from_fp8(&q, &sf, 32, 0, &yq), DG_ERR_LAYOUT);
    EXPECT_FAIL(dg_cast_back_from_fp8(&q, &sf, 32, 0, NULL), DG_ERR_NULL_POINTER, f, "out");
    TU_CHECK(yb[0] == y00 && qb[0] == 0x38, "cast_back_from_fp8 failures write nothing");
    TU_CHECK_OK(dg_cast_back_from_fp8(&q, &sf, 32, 0, &y));
    TU_CHECK(yb[0] == dg_e4m3_to_float(0x38), "cast_back_from_fp8 of code 0x38 with scale 1");
}

/* M = 1, K = 1, K = 0 and M = 0 shapes run and give DeepGEMM's shapes. */
static void test_small_shapes(void) {
    float one[1] = {-3.5f};
    uint8_t q[1];
    float s[1];
    dg_tensor x = dg_tensor_2d(one, DG_FLOAT32, 1, 1), out = dg_tensor_2d(q, DG_FLOAT8_E4M3, 1, 1),
              sf = dg_tensor_2d(s, DG_FLOAT32, 1, 1);
    TU_CHECK_OK(dg_per_token_cast_to_fp8(&x, 0, 128, 0, &out, &sf));
    TU_CHECK(s[0] == 3.5f / 448.0f && q[0] == dg_float_to_e4m3(-3.5f * (1.0f / s[0])), "1x1 per token: %g", s[0]);
    TU_CHECK_OK(dg_per_block_cast_to_fp8(&x, 1, 128, &out, &sf));
    TU_CHECK(s[0] == 0x1p-7f && q[0] == dg_float_to_e4m3(-3.5f * 128.0f), "1x1 per block ue8m0: %g", s[0]);
    one[0] = 0.0f; /* amax clamps at 1e-4 */
    TU_CHECK_OK(dg_per_token_cast_to_fp8(&x, 0, 128, 0, &out, &sf));
    TU_CHECK(s[0] == 1e-4f / 448.0f && q[0] == 0, "zero group: sf %g", s[0]);
    dg_tensor xk0 = dg_tensor_2d(NULL, DG_FLOAT32, 3, 0), ok0 = {0}, sk0 = {0};
    TU_CHECK_OK(dg_per_token_cast_to_fp8(&xk0, 0, 128, 0, &ok0, &sk0));
    TU_CHECK(ok0.shape[0] == 3 && ok0.shape[1] == 0 && sk0.shape[1] == 0, "K = 0 shapes");
    TU_CHECK_OK(dg_per_token_cast_to_fp8(&xk0, 0, 128, 0, &ok0, &sk0));
}

int main(void) {
    test_fp8_helpers();
    test_cast_back_fp8();
    test_custom_dims();
    test_fp4();
    test_pack_transpose();
    test_ceil_and_diff();
    test_small_shapes();
    test_bad_fp8();
    test_bad_fp4_and_utils();
    return tu_finish();
}
