/* test_sf_layout.c - scale-factor layout functions (SPEC 8): hand-derived vectors from
 * DeepGEMM's rules, randomized checks against a naive re-derivation, and bad inputs. */
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

static dg_tensor empty_out(void) {
    dg_tensor t;
    memset(&t, 0, sizeof t);
    return t;
}

/* Gives a queried descriptor memory filled with `sentinel`. */
static void alloc_out(dg_tensor *out, unsigned char sentinel) {
    const size_t n = dg_tensor_nbytes(out);
    out->data = malloc(n ? n : 1);
    memset(out->data, sentinel, n);
}

static float pow2(int e) { return ldexpf(1.0f, e); }
static uint8_t exp_byte(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint8_t)(u >> 23);
}

/* ---- get_tma_aligned_size ------------------------------------------------------------------ */

static void test_tma_aligned_size(void) {
    const int cases[][3] = {{5, 4, 8}, {4, 4, 4}, {0, 4, 0}, {1, 1, 16}, {17, 2, 24}, {3, 8, 4}, {4097, 4, 4100}, {16, 16, 16}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        int r = -1;
        TU_CHECK_OK(dg_get_tma_aligned_size(cases[i][0], cases[i][1], &r));
        TU_CHECK(r == cases[i][2], "tma aligned (%d, %d) = %d, want %d", cases[i][0], cases[i][1], r, cases[i][2]);
    }
    int r = 77;
    CHECK_FAIL(dg_get_tma_aligned_size(5, 3, &r), DG_ERR_VALUE, "element_size");
    CHECK_FAIL(dg_get_tma_aligned_size(5, 32, &r), DG_ERR_VALUE, "element_size");
    CHECK_FAIL(dg_get_tma_aligned_size(5, 0, &r), DG_ERR_VALUE, "element_size");
    CHECK_FAIL(dg_get_tma_aligned_size(-1, 4, &r), DG_ERR_VALUE, "'x'");
    CHECK_FAIL(dg_get_tma_aligned_size(2147483647, 4, &r), DG_ERR_OVERFLOW, "'x'");
    TU_CHECK(r == 77, "failed calls leave the result alone");
    CHECK_FAIL(dg_get_tma_aligned_size(5, 4, NULL), DG_ERR_NULL_POINTER, "out");
}

/* ---- get_mn_major_tma_aligned_tensor ------------------------------------------------------- */

static void test_mn_major_fixed(void) {
    /* sf [3, 2] row-major 1..6 -> MN-major, MN padded to 4: strides (1, 4); memory
     * col 0 = 1 3 5, one padding float (untouched), col 1 = 2 4 6. */
    float sf_data[6] = {1, 2, 3, 4, 5, 6};
    const dg_tensor sf = dg_tensor_2d(sf_data, DG_FLOAT32, 3, 2);
    dg_tensor out = empty_out();
    TU_CHECK_OK(dg_get_mn_major_tma_aligned_tensor(&sf, &out));
    TU_CHECK(out.data == NULL && out.dtype == DG_FLOAT32 && out.ndim == 2, "query descriptor");
    TU_CHECK(out.shape[0] == 3 && out.shape[1] == 2 && out.strides[0] == 1 && out.strides[1] == 4,
             "shape/strides (%lld %lld)/(%lld %lld)", (long long)out.shape[0], (long long)out.shape[1],
             (long long)out.strides[0], (long long)out.strides[1]);
    TU_CHECK(dg_tensor_nbytes(&out) == 7 * sizeof(float), "nbytes %zu", dg_tensor_nbytes(&out));
    alloc_out(&out, 0xAB);
    TU_CHECK_OK(dg_get_mn_major_tma_aligned_tensor(&sf, &out));
    const float want[7] = {1, 3, 5, 0, 2, 4, 6};
    const float *o = out.data;
    uint32_t pad;
    memcpy(&pad, &o[3], 4);
    for (int i = 0; i < 7; ++i)
        if (i != 3)
            TU_CHECK(o[i] == want[i], "mn-major element %d = %g, want %g", i, o[i], want[i]);
    TU_CHECK(pad == 0xABABABABu, "padding untouched");
    free(out.data);

    /* 3-D [2, 3, 2]: strides (8, 1, 4). */
    float sf3_data[12];
    for (int i = 0; i < 12; ++i)
        sf3_data[i] = (float)(i + 1);
    const dg_tensor sf3 = dg_tensor_3d(sf3_data, DG_FLOAT32, 2, 3, 2);
    out = empty_out();
    TU_CHECK_OK(dg_get_mn_major_tma_aligned_tensor(&sf3, &out));
    TU_CHECK(out.ndim == 3 && out.strides[0] == 8 && out.strides[1] == 1 && out.strides[2] == 4, "3-D strides");
    TU_CHECK(dg_tensor_nbytes(&out) == 15 * sizeof(float), "3-D nbytes");
    alloc_out(&out, 0);
    TU_CHECK_OK(dg_get_mn_major_tma_aligned_tensor(&sf3, &out));
    const float want3[15] = {1, 3, 5, 0, 2, 4, 6, 0, 7, 9, 11, 0, 8, 10, 12};
    TU_CHECK(memcmp(out.data, want3, sizeof want3) == 0, "3-D values");
    free(out.data);
}

/* Random shapes and input strides (row-major, MN-major, sliced) against the definition. */
static void test_mn_major_random(void) {
    tu_rng rng = {11};
    for (int iter = 0; iter < 40; ++iter) {
        const int64_t g = tu_randint(&rng, 1, 3), mn = tu_randint(&rng, 1, 13), sk = tu_randint(&rng, 1, 6);
        const int kind = (int)tu_randint(&rng, 0, 2), three = (int)tu_randint(&rng, 0, 1) || g > 1;
        const int64_t pad = 3;
        float *buf = malloc((size_t)(g * (mn + pad) * (sk + pad)) * sizeof(float));
        tu_fill_normal(&rng, buf, (size_t)(g * (mn + pad) * (sk + pad)), 1.0f);
        dg_tensor sf = dg_tensor_3d(buf, DG_FLOAT32, g, mn, sk);
        if (kind == 1) { /* MN-major */
            sf.strides[1] = 1;
            sf.strides[2] = mn;
        } else if (kind == 2) { /* a slice of a wider row-major tensor */
            sf.strides[1] = sk + pad;
            sf.strides[0] = mn * (sk + pad);
        }
        if (!three) { /* drop the batch dimension */
            sf.ndim = 2;
            sf.shape[0] = mn, sf.shape[1] = sk;
            sf.strides[0] = sf.strides[1], sf.strides[1] = sf.strides[2];
        }
        dg_tensor out = empty_out();
        TU_CHECK_OK(dg_get_mn_major_tma_aligned_tensor(&sf, &out));
        const int64_t aligned = (mn + 3) / 4 * 4;
        const int nd = sf.ndim;
        TU_CHECK(out.strides[nd - 2] == 1 && out.strides[nd - 1] == aligned && (nd == 2 || out.strides[0] == aligned * sk),
                 "random strides (iter %d)", iter);
        alloc_out(&out, 0x5A);
        TU_CHECK_OK(dg_get_mn_major_tma_aligned_tensor(&sf, &out));
        int bad = 0;
        for (int64_t b = 0; b < (nd == 3 ? g : 1); ++b)
            for (int64_t i = 0; i < mn; ++i)
                for (int64_t j = 0; j < sk; ++j) {
                    const int64_t so = (nd == 3 ? b * sf.strides[0] : 0) + i * sf.strides[nd - 2] + j * sf.strides[nd - 1];
                    const int64_t oo = b * aligned * sk + i + j * aligned;
                    bad += ((float *)out.data)[oo] != buf[so];
                }
        TU_CHECK(bad == 0, "random mn-major values (iter %d): %d wrong", iter, bad);
        free(out.data);
        free(buf);
    }
}

/* ---- get_mn_major_tma_aligned_packed_ue8m0_tensor ------------------------------------------ */

static void test_packed_fixed(void) {
    /* sf [2, 5]: exponent bytes row 0 = 127..131, row 1 = 126, 125, 127, 137, 117.
     * out INT32 [2, 2], strides (1, 4); word = byte0 | byte1 << 8 | ...; K padded with 0. */
    float sf_data[10] = {1, 2, 4, 8, 16, 0.5f, 0.25f, 1, 1024, 1.0f / 1024};
    const dg_tensor sf = dg_tensor_2d(sf_data, DG_FLOAT32, 2, 5);
    dg_tensor out = empty_out();
    TU_CHECK_OK(dg_get_mn_major_tma_aligned_packed_ue8m0_tensor(&sf, NULL, &out));
    TU_CHECK(out.dtype == DG_INT32 && out.ndim == 2 && out.shape[0] == 2 && out.shape[1] == 2 &&
                 out.strides[0] == 1 && out.strides[1] == 4, "packed descriptor");
    TU_CHECK(dg_tensor_nbytes(&out) == 6 * 4, "packed nbytes %zu", dg_tensor_nbytes(&out));
    alloc_out(&out, 0xEE);
    TU_CHECK_OK(dg_get_mn_major_tma_aligned_packed_ue8m0_tensor(&sf, NULL, &out));
    const uint32_t want[6] = {0x8281807Fu, 0x897F7D7Eu, 0xEEEEEEEEu, 0xEEEEEEEEu, 0x83u, 0x75u};
    TU_CHECK(memcmp(out.data, want, sizeof want) == 0, "packed values %08x %08x .. %08x %08x",
             ((uint32_t *)out.data)[0], ((uint32_t *)out.data)[1], ((uint32_t *)out.data)[4], ((uint32_t *)out.data)[5]);

    /* A zero scale packs to byte 0; a non-power of two is rejected with out untouched. */
    sf_data[4] = 0.0f;
    TU_CHECK_OK(dg_get_mn_major_tma_aligned_packed_ue8m0_tensor(&sf, NULL, &out));
    TU_CHECK(((uint32_t *)out.data)[4] == 0, "zero scale packs to 0");
    sf_data[7] = 3.0f;
    void *snap = tu_snapshot(&out);
    CHECK_FAIL(dg_get_mn_major_tma_aligned_packed_ue8m0_tensor(&sf, NULL, &out), DG_ERR_VALUE, "power of two");
    TU_CHECK(tu_unchanged(&out, snap), "rejected values leave out untouched");
    sf_data[7] = -1.0f;
    CHECK_FAIL(dg_get_mn_major_tma_aligned_packed_ue8m0_tensor(&sf, NULL, &out), DG_ERR_VALUE, "sf");
    TU_CHECK(tu_unchanged(&out, snap), "negative scale leaves out untouched");
    free(snap);
    free(out.data);
}

static void test_packed_psum(void) {
    /* mn = 10 rows, alignment 4, psum ends (3, 7): valid rows [0, 3) and [4, 7); rows 3, 7, 8, 9
     * are gaps: packed to 0 and never checked (they hold 3.0 here). */
    const int old = dg_get_mk_alignment_for_contiguous_layout();
    TU_CHECK_OK(dg_set_mk_alignment_for_contiguous_layout(4));
    float sf_data[20];
    for (int i = 0; i < 10; ++i) {
        sf_data[2 * i] = pow2(i);
        sf_data[2 * i + 1] = pow2(-i);
    }
    const int gaps[4] = {3, 7, 8, 9};
    for (int i = 0; i < 4; ++i)
        sf_data[2 * gaps[i]] = 3.0f;
    int32_t ends[2] = {3, 7};
    const dg_tensor sf = dg_tensor_2d(sf_data, DG_FLOAT32, 10, 2);
    const dg_tensor psum = dg_tensor_1d(ends, DG_INT32, 2);
    dg_tensor out = empty_out();
    TU_CHECK_OK(dg_get_mn_major_tma_aligned_packed_ue8m0_tensor(&sf, &psum, &out));
    TU_CHECK(out.shape[0] == 10 && out.shape[1] == 1 && out.strides[0] == 1, "psum descriptor");
    alloc_out(&out, 0x11);
    TU_CHECK_OK(dg_get_mn_major_tma_aligned_packed_ue8m0_tensor(&sf, &psum, &out));
    const uint32_t *o = out.data;
    for (uint32_t i = 0; i < 10; ++i) {
        const bool gap = i == 3 || i >= 7;
        const uint32_t want = gap ? 0 : (uint32_t)(127 + i) | (uint32_t)(127 - i) << 8;
        TU_CHECK(o[i] == want, "psum row %u = %08x, want %08x", i, o[i], want);
    }
    /* Bad psum layouts. */
    int32_t bad_ends[2] = {5, 2};
    const dg_tensor bad = dg_tensor_1d(bad_ends, DG_INT32, 2);
    void *snap = tu_snapshot(&out);
    CHECK_FAIL(dg_get_mn_major_tma_aligned_packed_ue8m0_tensor(&sf, &bad, &out), DG_ERR_VALUE, "psum_layout");
    const dg_tensor empty = dg_tensor_1d(ends, DG_INT32, 0);
    CHECK_FAIL(dg_get_mn_major_tma_aligned_packed_ue8m0_tensor(&sf, &empty, &out), DG_ERR_SHAPE, "psum_layout");
    const dg_tensor wrong_type = dg_tensor_1d(ends, DG_INT64, 1);
    CHECK_FAIL(dg_get_mn_major_tma_aligned_packed_ue8m0_tensor(&sf, &wrong_type, &out), DG_ERR_DTYPE, "psum_layout");
    const dg_tensor sf_t = dg_tensor_transpose(dg_tensor_2d(sf_data, DG_FLOAT32, 2, 10), 0, 1);
    CHECK_FAIL(dg_get_mn_major_tma_aligned_packed_ue8m0_tensor(&sf_t, &psum, &out), DG_ERR_LAYOUT, "sf");
    const dg_tensor sf_g = dg_tensor_3d(sf_data, DG_FLOAT32, 2, 5, 2);
    dg_tensor q = empty_out();
    CHECK_FAIL(dg_get_mn_major_tma_aligned_packed_ue8m0_tensor(&sf_g, &psum, &q), DG_ERR_SHAPE, "sf");
    TU_CHECK(q.ndim == 0 && q.data == NULL, "a failed query leaves the descriptor alone");
    TU_CHECK(tu_unchanged(&out, snap), "bad psum leaves out untouched");
    free(snap);
    free(out.data);
    TU_CHECK_OK(dg_set_mk_alignment_for_contiguous_layout(old));
}

static void test_packed_random(void) {
    tu_rng rng = {23};
    for (int iter = 0; iter < 40; ++iter) {
        const int64_t g = tu_randint(&rng, 1, 3), mn = tu_randint(&rng, 1, 11), sk = tu_randint(&rng, 1, 10);
        const bool mn_major = tu_randint(&rng, 0, 1);
        const size_t n = (size_t)(g * mn * sk);
        float *buf = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; ++i)
            buf[i] = pow2((int)tu_randint(&rng, -40, 40));
        dg_tensor sf = dg_tensor_3d(buf, DG_FLOAT32, g, mn, sk);
        if (mn_major)
            sf.strides[1] = 1, sf.strides[2] = mn;
        dg_tensor out = empty_out();
        TU_CHECK_OK(dg_get_mn_major_tma_aligned_packed_ue8m0_tensor(&sf, NULL, &out));
        const int64_t aligned = (mn + 3) / 4 * 4, pk = (sk + 3) / 4;
        TU_CHECK(out.shape[0] == g && out.shape[1] == mn && out.shape[2] == pk && out.strides[0] == pk * aligned &&
                     out.strides[1] == 1 && out.strides[2] == aligned, "random packed descriptor (iter %d)", iter);
        alloc_out(&out, 0x33);
        TU_CHECK_OK(dg_get_mn_major_tma_aligned_packed_ue8m0_tensor(&sf, NULL, &out));
        int bad = 0;
        for (int64_t b = 0; b < g; ++b)
            for (int64_t i = 0; i < mn; ++i)
                for (int64_t q = 0; q < pk; ++q) {
                    const uint8_t *bytes = (const uint8_t *)((uint32_t *)out.data + b * pk * aligned + i + q * aligned);
                    for (int j = 0; j < 4; ++j) {
                        const int64_t kk = 4 * q + j;
                        const uint8_t want =
                            kk < sk ? exp_byte(buf[b * sf.strides[0] + i * sf.strides[1] + kk * sf.strides[2]]) : 0;
                        bad += bytes[j] != want;
                    }
                }
        TU_CHECK(bad == 0, "random packed values (iter %d): %d wrong", iter, bad);
        free(out.data);
        free(buf);
    }
}

/* ---- get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor -------------------------------- */

/* sf [rows, 4] with exponent byte 100 + 10 r + c. */
static float *k_grouped_sf(int rows) {
    float *sf = malloc((size_t)rows * 4 * sizeof(float));
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < 4; ++c)
            sf[r * 4 + c] = pow2(100 + 10 * r + c - 127);
    return sf;
}

static void test_k_grouped_fixed(void) {
    /* gran_k 32, ks (64, 160): scale rows 2 + 5 = 7; packed rows 1 + 2 = 3:
     * row 0 = group 0 rows 0..1, row 1 = group 1 rows 2..5, row 2 = group 1 row 6. */
    float *sf_data = k_grouped_sf(7);
    const dg_tensor sf = dg_tensor_2d(sf_data, DG_FLOAT32, 7, 4);
    int32_t layout[2] = {64, 160};
    const int ks[2] = {64, 160};
    const dg_tensor gl = dg_tensor_1d(layout, DG_INT32, 2);
    dg_tensor out = empty_out();
    TU_CHECK_OK(dg_get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(&sf, &gl, ks, 2, 32, 32, 0, &out));
    TU_CHECK(out.dtype == DG_INT32 && out.ndim == 2 && out.shape[0] == 3 && out.shape[1] == 4 && out.strides[0] == 4 &&
                 out.strides[1] == 1, "k-grouped descriptor");
    alloc_out(&out, 0x77);
    TU_CHECK_OK(dg_get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(&sf, &gl, ks, 2, 32, 32, 0, &out));
    const uint32_t want[12] = {0x6E64, 0x6F65, 0x7066, 0x7167,
                               0x968C8278u, 0x978D8379u, 0x988E847Au, 0x998F857Bu,
                               0xA0, 0xA1, 0xA2, 0xA3};
    TU_CHECK(memcmp(out.data, want, sizeof want) == 0, "k-grouped values");
    free(out.data);

    /* psum: real ks (64, 100), k_alignment 128 -> ends (64, 228). Each group owns the scale rows
     * of its aligned K (128 / 32 = 4 each: 8 rows), of which its own K's are packed: rows 0..1
     * and 4..7. With ks: 1 + 1 packed rows; without: (8 + 3 * 2) / 4 = 3, the last unowned (0). */
    int32_t ends[2] = {64, 228};
    const int real_ks[2] = {64, 100};
    const dg_tensor pl = dg_tensor_1d(ends, DG_INT32, 2);
    float *sf8_data = k_grouped_sf(8);
    const dg_tensor sf8 = dg_tensor_2d(sf8_data, DG_FLOAT32, 8, 4);
    const uint32_t want_psum[12] = {0x6E64, 0x6F65, 0x7066, 0x7167,
                                    0xAAA0968Cu, 0xABA1978Du, 0xACA2988Eu, 0xADA3998Fu, 0, 0, 0, 0};
    const dg_tensor sf7_short = dg_tensor_2d(sf8_data, DG_FLOAT32, 7, 4);
    dg_tensor q = empty_out();
    CHECK_FAIL(dg_get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(&sf7_short, &pl, NULL, 0, 32, 128, 1, &q),
               DG_ERR_SHAPE, "sf");
    out = empty_out();
    TU_CHECK_OK(dg_get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(&sf8, &pl, real_ks, 2, 32, 128, 1, &out));
    TU_CHECK(out.shape[0] == 2, "psum rows with ks: %lld", (long long)out.shape[0]);
    alloc_out(&out, 0x77);
    TU_CHECK_OK(dg_get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(&sf8, &pl, real_ks, 2, 32, 128, 1, &out));
    TU_CHECK(memcmp(out.data, want_psum, 8 * 4) == 0, "psum values with ks");
    free(out.data);
    out = empty_out();
    TU_CHECK_OK(dg_get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(&sf8, &pl, NULL, 0, 32, 128, 1, &out));
    TU_CHECK(out.shape[0] == 3, "psum rows without ks: %lld", (long long)out.shape[0]);
    alloc_out(&out, 0x77);
    TU_CHECK_OK(dg_get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(&sf8, &pl, NULL, 0, 32, 128, 1, &out));
    TU_CHECK(memcmp(out.data, want_psum, sizeof want_psum) == 0, "psum values without ks");

    /* Bad inputs, out untouched. */
    void *snap = tu_snapshot(&out);
    int32_t wrong[2] = {64, 128};
    const dg_tensor gl_wrong = dg_tensor_1d(wrong, DG_INT32, 2);
    CHECK_FAIL(dg_get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(&sf, &gl_wrong, ks, 2, 32, 32, 0, &out),
               DG_ERR_VALUE, "grouped_layout");
    CHECK_FAIL(dg_get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(&sf8, &gl, ks, 2, 32, 32, 0, &out),
               DG_ERR_SHAPE, "sf");
    CHECK_FAIL(dg_get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(&sf, &gl, NULL, 0, 32, 32, 0, &out),
               DG_ERR_VALUE, "ks");
    CHECK_FAIL(dg_get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(&sf, &gl, ks, 1, 32, 32, 0, &out),
               DG_ERR_SHAPE, "ks");
    CHECK_FAIL(dg_get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(&sf, &gl, NULL, 2, 32, 32, 0, &out),
               DG_ERR_NULL_POINTER, "ks");
    CHECK_FAIL(dg_get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(&sf, &gl, ks, 2, 64, 32, 0, &out),
               DG_ERR_VALUE, "gran_k");
    CHECK_FAIL(dg_get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(&sf, &gl, ks, 2, 32, 48, 0, &out),
               DG_ERR_VALUE, "k_alignment");
    CHECK_FAIL(dg_get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(&sf, &gl, ks, 2, 32, 0, 0, &out),
               DG_ERR_VALUE, "k_alignment");
    int32_t bad_ends[2] = {100, 200}; /* group 1 would start at align(100, 128) = 128 < 200: fine */
    bad_ends[1] = 120;                /* ... but 120 < 128: negative group */
    const dg_tensor pl_bad = dg_tensor_1d(bad_ends, DG_INT32, 2);
    CHECK_FAIL(dg_get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(&sf8, &pl_bad, NULL, 0, 32, 128, 1, &out),
               DG_ERR_VALUE, "grouped_layout");
    int32_t big_ends[2] = {64, 400}; /* needs 4 + 12 rows, sf has 8 */
    const dg_tensor pl_big = dg_tensor_1d(big_ends, DG_INT32, 2);
    CHECK_FAIL(dg_get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(&sf8, &pl_big, NULL, 0, 32, 128, 1, &out),
               DG_ERR_SHAPE, "sf");
    const dg_tensor sf3 = dg_tensor_2d(sf_data, DG_FLOAT32, 7, 3);
    CHECK_FAIL(dg_get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(&sf3, &gl, ks, 2, 32, 32, 0, &out),
               DG_ERR_SHAPE, "sf");
    const dg_tensor sft = dg_tensor_transpose(dg_tensor_2d(sf_data, DG_FLOAT32, 4, 7), 0, 1);
    CHECK_FAIL(dg_get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(&sft, &gl, ks, 2, 32, 32, 0, &out),
               DG_ERR_LAYOUT, "sf");
    const dg_tensor gl64 = dg_tensor_1d(layout, DG_INT64, 1);
    CHECK_FAIL(dg_get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(&sf, &gl64, ks, 1, 32, 32, 0, &out),
               DG_ERR_DTYPE, "grouped_layout");
    const int neg_ks[2] = {64, -1};
    CHECK_FAIL(dg_get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(&sf8, &pl, neg_ks, 2, 32, 128, 1, &out),
               DG_ERR_VALUE, "ks");
    CHECK_FAIL(dg_get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(&sf8, &pl, NULL, 0, 32, 128, 1, NULL),
               DG_ERR_NULL_POINTER, "out");
    dg_tensor out_bad = out;
    out_bad.shape[0] = 2;
    CHECK_FAIL(dg_get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(&sf8, &pl, NULL, 0, 32, 128, 1, &out_bad),
               DG_ERR_SHAPE, "out");
    out_bad = out;
    out_bad.dtype = DG_FLOAT32;
    CHECK_FAIL(dg_get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(&sf8, &pl, NULL, 0, 32, 128, 1, &out_bad),
               DG_ERR_DTYPE, "out");
    sf8_data[5] = 3.0f; /* row 1, column 1 */
    CHECK_FAIL(dg_get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(&sf8, &pl, NULL, 0, 32, 128, 1, &out),
               DG_ERR_VALUE, "power of two");
    sf8_data[5] = 1.0f;
    /* An output aliasing the input scales. */
    void *sf_snap = tu_snapshot(&sf8);
    dg_tensor alias = out;
    alias.data = sf8_data;
    alias.shape[0] = 2;
    CHECK_FAIL(dg_get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(&sf8, &pl, real_ks, 2, 32, 128, 1, &alias),
               DG_ERR_LAYOUT, "out");
    TU_CHECK(tu_unchanged(&sf8, sf_snap), "aliased input untouched");
    free(sf_snap);
    TU_CHECK(tu_unchanged(&out, snap), "bad k-grouped calls leave out untouched");
    free(snap);
    free(out.data);
    free(sf_data);
    free(sf8_data);
}

/* Random K sizes (some empty): each group's rows packed on their own, as DeepGEMM's test. */
static void test_k_grouped_random(void) {
    tu_rng rng = {37};
    for (int iter = 0; iter < 30; ++iter) {
        const int groups = (int)tu_randint(&rng, 1, 6), gran_k = tu_randint(&rng, 0, 1) ? 32 : 128;
        const int mn = 4 * (int)tu_randint(&rng, 1, 3);
        const bool psum = tu_randint(&rng, 0, 1);
        const int k_alignment = 32 * (int)tu_randint(&rng, 1, 7);
        int ks[6], rows[6], in_rows[6], total_rows = 0, packed_rows = 0;
        int32_t layout[6];
        int64_t end = 0;
        for (int g = 0; g < groups; ++g) {
            ks[g] = tu_randint(&rng, 0, 3) == 0 ? 0 : (int)tu_randint(&rng, 1, 9 * gran_k);
            rows[g] = (ks[g] + gran_k - 1) / gran_k;
            /* input rows: those of the aligned K with psum (DeepGEMM's layout), packed: rows[g] */
            const int aligned = psum ? (ks[g] + k_alignment - 1) / k_alignment * k_alignment : ks[g];
            in_rows[g] = (aligned + gran_k - 1) / gran_k;
            total_rows += in_rows[g];
            packed_rows += (rows[g] + 3) / 4;
            end = (g == 0 ? 0 : (end + k_alignment - 1) / k_alignment * k_alignment) + ks[g];
            layout[g] = psum ? (int32_t)end : ks[g];
        }
        float *sf_data = malloc((size_t)(total_rows ? total_rows : 1) * mn * sizeof(float));
        for (int i = 0; i < total_rows * mn; ++i)
            sf_data[i] = pow2((int)tu_randint(&rng, -30, 30));
        const dg_tensor sf = dg_tensor_2d(sf_data, DG_FLOAT32, total_rows, mn);
        const dg_tensor gl = dg_tensor_1d(layout, DG_INT32, groups);
        dg_tensor out = empty_out();
        TU_CHECK_OK(dg_get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(&sf, &gl, ks, groups, gran_k, k_alignment,
                                                                               psum, &out));
        TU_CHECK(out.shape[0] == packed_rows && out.shape[1] == mn, "random k-grouped shape (iter %d)", iter);
        alloc_out(&out, 0x44);
        TU_CHECK_OK(dg_get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(&sf, &gl, ks, groups, gran_k, k_alignment,
                                                                               psum, &out));
        int bad = 0, sf_row = 0, out_row = 0;
        for (int g = 0; g < groups; ++g) {
            for (int p = 0; p < (rows[g] + 3) / 4; ++p, ++out_row)
                for (int c = 0; c < mn; ++c) {
                    const uint8_t *bytes = (const uint8_t *)((uint32_t *)out.data + out_row * mn + c);
                    for (int j = 0; j < 4; ++j) {
                        const int r = 4 * p + j;
                        const uint8_t want = r < rows[g] ? exp_byte(sf_data[(sf_row + r) * mn + c]) : 0;
                        bad += bytes[j] != want;
                    }
                }
            sf_row += in_rows[g];
        }
        TU_CHECK(bad == 0, "random k-grouped values (iter %d): %d wrong", iter, bad);
        free(out.data);
        free(sf_data);
    }
}

/* ---- transform_sf_into_required_layout ----------------------------------------------------- */

static const int kRecipe1D2D[3] = {1, 128, 128};

static void test_transform_fixed(void) {
    /* SFA, recipe (1, 128, 128), mn 5, k 300: sf [5, 3] = 2^(i - j) -> packed [5, 1], strides (1, 8). */
    float sfa_data[15];
    for (int i = 0; i < 5; ++i)
        for (int j = 0; j < 3; ++j)
            sfa_data[i * 3 + j] = pow2(i - j);
    const dg_tensor sfa = dg_tensor_2d(sfa_data, DG_FLOAT32, 5, 3);
    dg_tensor out = empty_out();
    TU_CHECK_OK(dg_transform_sf_into_required_layout(&sfa, 5, 300, kRecipe1D2D, 3, 0, 1, 0, NULL, &out));
    TU_CHECK(out.dtype == DG_INT32 && out.shape[0] == 5 && out.shape[1] == 1 && out.strides[0] == 1 &&
                 out.strides[1] == 8, "transform sfa descriptor");
    alloc_out(&out, 0);
    TU_CHECK_OK(dg_transform_sf_into_required_layout(&sfa, 5, 300, kRecipe1D2D, 3, 0, 1, 0, NULL, &out));
    const uint32_t want_a[5] = {0x7D7E7F, 0x7E7F80, 0x7F8081, 0x808182, 0x818283};
    TU_CHECK(memcmp(out.data, want_a, sizeof want_a) == 0, "transform sfa values");
    free(out.data);

    /* SFB, same recipe, mn 200, k 256: sf [2, 2] = (1, 2; 4, 8) broadcast to 200 rows. */
    float sfb_data[4] = {1, 2, 4, 8};
    const dg_tensor sfb = dg_tensor_2d(sfb_data, DG_FLOAT32, 2, 2);
    out = empty_out();
    TU_CHECK_OK(dg_transform_sf_into_required_layout(&sfb, 200, 256, kRecipe1D2D, 3, 0, 0, 0, NULL, &out));
    TU_CHECK(out.shape[0] == 200 && out.shape[1] == 1 && out.strides[0] == 1 && out.strides[1] == 200,
             "transform sfb descriptor");
    alloc_out(&out, 0);
    TU_CHECK_OK(dg_transform_sf_into_required_layout(&sfb, 200, 256, kRecipe1D2D, 3, 0, 0, 0, NULL, &out));
    int bad = 0;
    for (int i = 0; i < 200; ++i)
        bad += ((uint32_t *)out.data)[i] != (i < 128 ? 0x807Fu : 0x8281u);
    TU_CHECK(bad == 0, "transform sfb broadcast values: %d wrong", bad);
    free(out.data);

    /* Already packed INT32 (1, 128): TMA-aligned MN-major input is copied with its strides. */
    int32_t packed_data[8] = {10, 11, 12, 13, 14, -1, -1, -1};
    dg_tensor packed = dg_tensor_2d(packed_data, DG_INT32, 5, 1);
    packed.strides[0] = 1, packed.strides[1] = 8;
    const int r2[2] = {1, 128};
    out = empty_out();
    TU_CHECK_OK(dg_transform_sf_into_required_layout(&packed, 5, 300, r2, 2, 0, -1, 0, NULL, &out));
    TU_CHECK(out.dtype == DG_INT32 && out.strides[0] == 1 && out.strides[1] == 8 && out.shape[0] == 5, "int pass-through");
    alloc_out(&out, 0);
    TU_CHECK_OK(dg_transform_sf_into_required_layout(&packed, 5, 300, r2, 2, 0, -1, 0, NULL, &out));
    TU_CHECK(memcmp(out.data, packed_data, 5 * 4) == 0, "int pass-through values");
    free(out.data);
    packed.strides[1] = 5;
    out = empty_out();
    CHECK_FAIL(dg_transform_sf_into_required_layout(&packed, 5, 300, r2, 2, 0, -1, 0, NULL, &out), DG_ERR_LAYOUT, "sf");

    /* disable_ue8m0_cast: SM90 answers. (1, 128) float -> MN-major float. */
    float f_data[6] = {1.5f, 2.5f, 3.5f, 4.5f, 5.5f, 6.5f};
    const dg_tensor f = dg_tensor_2d(f_data, DG_FLOAT32, 3, 2);
    out = empty_out();
    TU_CHECK_OK(dg_transform_sf_into_required_layout(&f, 3, 256, kRecipe1D2D, 3, 0, 1, 1, NULL, &out));
    TU_CHECK(out.dtype == DG_FLOAT32 && out.strides[0] == 1 && out.strides[1] == 4, "disable (1, 128) descriptor");
    alloc_out(&out, 0);
    TU_CHECK_OK(dg_transform_sf_into_required_layout(&f, 3, 256, kRecipe1D2D, 3, 0, 1, 1, NULL, &out));
    const float want_f[7] = {1.5f, 3.5f, 5.5f, 0, 2.5f, 4.5f, 6.5f};
    const float *of = out.data;
    TU_CHECK(of[0] == want_f[0] && of[1] == want_f[1] && of[2] == want_f[2] && of[4] == want_f[4] &&
                 of[5] == want_f[5] && of[6] == want_f[6], "disable (1, 128) values");
    free(out.data);

    /* (128, 128) float with disable: contiguous or MN-major contiguous, returned as is. */
    float b_data[12];
    for (int i = 0; i < 12; ++i)
        b_data[i] = 0.25f * (float)i + 0.1f;
    const dg_tensor b_rm = dg_tensor_2d(b_data, DG_FLOAT32, 2, 3);
    const dg_tensor b_cm = dg_tensor_transpose(dg_tensor_2d(b_data, DG_FLOAT32, 3, 2), 0, 1);
    const dg_tensor *views[2] = {&b_rm, &b_cm};
    for (int v = 0; v < 2; ++v) {
        out = empty_out();
        TU_CHECK_OK(dg_transform_sf_into_required_layout(views[v], 256, 384, kRecipe1D2D, 3, 0, 0, 1, NULL, &out));
        TU_CHECK(out.strides[0] == views[v]->strides[0] && out.strides[1] == views[v]->strides[1] &&
                     out.dtype == DG_FLOAT32, "(128, 128) pass-through strides (view %d)", v);
        alloc_out(&out, 0);
        TU_CHECK_OK(dg_transform_sf_into_required_layout(views[v], 256, 384, kRecipe1D2D, 3, 0, 0, 1, NULL, &out));
        TU_CHECK(memcmp(out.data, b_data, 6 * sizeof(float)) == 0, "(128, 128) pass-through values (view %d)", v);
        free(out.data);
    }
    const dg_tensor b_g = dg_tensor_3d(b_data, DG_FLOAT32, 2, 2, 3);
    out = empty_out();
    TU_CHECK_OK(dg_transform_sf_into_required_layout(&b_g, 256, 384, kRecipe1D2D, 3, 2, 0, 1, NULL, &out));
    TU_CHECK(out.ndim == 3 && out.strides[0] == 6, "(128, 128) grouped pass-through");
    dg_tensor b_slice = dg_tensor_2d(b_data, DG_FLOAT32, 2, 3);
    b_slice.strides[0] = 5;
    CHECK_FAIL(dg_transform_sf_into_required_layout(&b_slice, 256, 384, kRecipe1D2D, 3, 0, 0, 1, NULL, &out),
               DG_ERR_LAYOUT, "sf");

    /* Groups: sf [2, 5, 3] -> packed [2, 5, 1], strides (8, 1, 8). */
    float g_data[30];
    for (int i = 0; i < 30; ++i)
        g_data[i] = pow2(i % 7 - 3);
    const dg_tensor sfg = dg_tensor_3d(g_data, DG_FLOAT32, 2, 5, 3);
    out = empty_out();
    TU_CHECK_OK(dg_transform_sf_into_required_layout(&sfg, 5, 300, kRecipe1D2D, 3, 2, 1, 0, NULL, &out));
    TU_CHECK(out.ndim == 3 && out.shape[0] == 2 && out.shape[1] == 5 && out.shape[2] == 1 && out.strides[0] == 8 &&
                 out.strides[1] == 1 && out.strides[2] == 8, "grouped packed descriptor");
    alloc_out(&out, 0);
    TU_CHECK_OK(dg_transform_sf_into_required_layout(&sfg, 5, 300, kRecipe1D2D, 3, 2, 1, 0, NULL, &out));
    bad = 0;
    for (int g = 0; g < 2; ++g)
        for (int i = 0; i < 5; ++i) {
            uint32_t w = 0;
            for (int j = 0; j < 3; ++j)
                w |= (uint32_t)exp_byte(g_data[g * 15 + i * 3 + j]) << (8 * j);
            bad += ((uint32_t *)out.data)[g * 8 + i] != w;
        }
    TU_CHECK(bad == 0, "grouped packed values");
    free(out.data);
}

static void test_transform_errors(void) {
    float sf_data[15];
    for (int i = 0; i < 15; ++i)
        sf_data[i] = 1.0f;
    const dg_tensor sf = dg_tensor_2d(sf_data, DG_FLOAT32, 5, 3);
    dg_tensor out = empty_out();
    TU_CHECK_OK(dg_transform_sf_into_required_layout(&sf, 5, 300, kRecipe1D2D, 3, 0, 1, 0, NULL, &out));
    alloc_out(&out, 0x99);
    void *snap = tu_snapshot(&out), *sf_snap = tu_snapshot(&sf);
    const int r32[3] = {1, 1, 32}, r64[3] = {1, 1, 64}, r0[3] = {0, 128, 128};
    CHECK_FAIL(dg_transform_sf_into_required_layout(&sf, 5, 300, NULL, 3, 0, 1, 0, NULL, &out), DG_ERR_NULL_POINTER, "recipe");
    CHECK_FAIL(dg_transform_sf_into_required_layout(&sf, 5, 300, kRecipe1D2D, 4, 0, 1, 0, NULL, &out), DG_ERR_VALUE, "recipe_len");
    CHECK_FAIL(dg_transform_sf_into_required_layout(&sf, 5, 300, kRecipe1D2D, 3, 0, -1, 0, NULL, &out), DG_ERR_VALUE, "is_sfa");
    CHECK_FAIL(dg_transform_sf_into_required_layout(&sf, 5, 300, kRecipe1D2D, 2, 0, 1, 0, NULL, &out), DG_ERR_VALUE, "is_sfa");
    CHECK_FAIL(dg_transform_sf_into_required_layout(&sf, 5, 300, r0, 3, 0, 1, 0, NULL, &out), DG_ERR_VALUE, "recipe");
    CHECK_FAIL(dg_transform_sf_into_required_layout(&sf, 6, 300, kRecipe1D2D, 3, 0, 1, 0, NULL, &out), DG_ERR_SHAPE, "sf");
    CHECK_FAIL(dg_transform_sf_into_required_layout(&sf, 5, 500, kRecipe1D2D, 3, 0, 1, 0, NULL, &out), DG_ERR_SHAPE, "sf");
    CHECK_FAIL(dg_transform_sf_into_required_layout(&sf, 5, 300, kRecipe1D2D, 3, 2, 1, 0, NULL, &out), DG_ERR_SHAPE, "sf");
    CHECK_FAIL(dg_transform_sf_into_required_layout(&sf, -5, 300, kRecipe1D2D, 3, 0, 1, 0, NULL, &out), DG_ERR_VALUE, "mn");
    CHECK_FAIL(dg_transform_sf_into_required_layout(NULL, 5, 300, kRecipe1D2D, 3, 0, 1, 0, NULL, &out), DG_ERR_NULL_POINTER, "sf");
    CHECK_FAIL(dg_transform_sf_into_required_layout(&sf, 5, 300, kRecipe1D2D, 3, 0, 1, 0, NULL, NULL), DG_ERR_NULL_POINTER, "out");
    /* Float gran_k 32 with disable_ue8m0_cast; unknown transformations. */
    const dg_tensor sf32 = dg_tensor_2d(sf_data, DG_FLOAT32, 5, 3);
    CHECK_FAIL(dg_transform_sf_into_required_layout(&sf32, 5, 96, r32, 3, 0, 1, 1, NULL, &out), DG_ERR_VALUE, "'disable_ue8m0_cast'");
    const dg_tensor sf64 = dg_tensor_2d(sf_data, DG_FLOAT32, 5, 3);
    CHECK_FAIL(dg_transform_sf_into_required_layout(&sf64, 5, 192, r64, 3, 0, 1, 0, NULL, &out), DG_ERR_VALUE, "'recipe': unknown SF");
    int32_t ints[4] = {0};
    const dg_tensor sfi = dg_tensor_2d(ints, DG_INT32, 2, 1);
    CHECK_FAIL(dg_transform_sf_into_required_layout(&sfi, 256, 512, kRecipe1D2D, 3, 0, 0, 0, NULL, &out), DG_ERR_VALUE, "'recipe': unknown SF");
    const dg_tensor sfh = dg_tensor_2d(sf_data, DG_BFLOAT16, 5, 3);
    CHECK_FAIL(dg_transform_sf_into_required_layout(&sfh, 5, 300, kRecipe1D2D, 3, 0, 1, 0, NULL, &out), DG_ERR_DTYPE, "sf");
    /* Outputs with the wrong descriptor or aliasing the input. */
    dg_tensor o2 = out;
    o2.strides[0] = 2;
    CHECK_FAIL(dg_transform_sf_into_required_layout(&sf, 5, 300, kRecipe1D2D, 3, 0, 1, 0, NULL, &o2), DG_ERR_LAYOUT, "out");
    o2 = out;
    o2.dtype = DG_FLOAT32;
    CHECK_FAIL(dg_transform_sf_into_required_layout(&sf, 5, 300, kRecipe1D2D, 3, 0, 1, 0, NULL, &o2), DG_ERR_DTYPE, "out");
    o2 = out;
    o2.data = sf_data + 2;
    CHECK_FAIL(dg_transform_sf_into_required_layout(&sf, 5, 300, kRecipe1D2D, 3, 0, 1, 0, NULL, &o2), DG_ERR_LAYOUT, "out");
    /* A psum layout with several groups of scales. */
    float g_data[30];
    for (int i = 0; i < 30; ++i)
        g_data[i] = 1.0f;
    const dg_tensor sfg = dg_tensor_3d(g_data, DG_FLOAT32, 2, 5, 3);
    int32_t ends[1] = {5};
    const dg_tensor psum = dg_tensor_1d(ends, DG_INT32, 1);
    dg_tensor q = empty_out();
    CHECK_FAIL(dg_transform_sf_into_required_layout(&sfg, 5, 300, kRecipe1D2D, 3, 2, 1, 0, &psum, &q), DG_ERR_SHAPE, "sf");
    /* Non power-of-two float scales cannot be packed. */
    sf_data[7] = 0.3f;
    CHECK_FAIL(dg_transform_sf_into_required_layout(&sf, 5, 300, kRecipe1D2D, 3, 0, 1, 0, NULL, &out), DG_ERR_VALUE, "power of two");
    sf_data[7] = 1.0f;
    TU_CHECK(tu_unchanged(&out, snap), "bad transform calls leave out untouched");
    TU_CHECK(tu_unchanged(&sf, sf_snap), "bad transform calls leave sf untouched");
    free(snap);
    free(sf_snap);
    free(out.data);
}

/* Float -> packed with random (gran_mn, gran_k), groups and input strides, against the rule
 * "row i uses scale row i / gran_mn, byte j of word q is scale 4q + j". */
static void test_transform_random(void) {
    tu_rng rng = {51};
    const int gmns[3] = {1, 32, 128}, gks[2] = {32, 128};
    for (int iter = 0; iter < 30; ++iter) {
        const int gmn = gmns[tu_randint(&rng, 0, 2)], gk = gks[tu_randint(&rng, 0, 1)];
        const int groups = (int)tu_randint(&rng, 0, 2);
        const int64_t mn = tu_randint(&rng, 1, 300), k = tu_randint(&rng, 1, 1200);
        const int64_t rows = (mn + gmn - 1) / gmn, sk = (k + gk - 1) / gk, g = groups ? groups : 1;
        float *buf = malloc((size_t)(g * rows * sk) * sizeof(float));
        for (int64_t i = 0; i < g * rows * sk; ++i)
            buf[i] = pow2((int)tu_randint(&rng, -60, 60));
        dg_tensor sf = groups ? dg_tensor_3d(buf, DG_FLOAT32, g, rows, sk) : dg_tensor_2d(buf, DG_FLOAT32, rows, sk);
        const bool mn_major = tu_randint(&rng, 0, 1);
        const int nd = sf.ndim;
        if (mn_major)
            sf.strides[nd - 2] = 1, sf.strides[nd - 1] = rows;
        const int recipe[3] = {gmn, 7, gk};
        dg_tensor out = empty_out();
        TU_CHECK_OK(dg_transform_sf_into_required_layout(&sf, mn, k, recipe, 3, groups, 1, 0, NULL, &out));
        const int64_t aligned = (mn + 3) / 4 * 4, pk = (sk + 3) / 4;
        TU_CHECK(out.shape[nd - 2] == mn && out.shape[nd - 1] == pk && out.strides[nd - 2] == 1 &&
                     out.strides[nd - 1] == aligned && (nd == 2 || out.strides[0] == aligned * pk),
                 "random transform descriptor (iter %d)", iter);
        alloc_out(&out, 0);
        TU_CHECK_OK(dg_transform_sf_into_required_layout(&sf, mn, k, recipe, 3, groups, 1, 0, NULL, &out));
        int bad = 0;
        for (int64_t b = 0; b < g; ++b)
            for (int64_t i = 0; i < mn; ++i)
                for (int64_t q = 0; q < pk; ++q) {
                    uint32_t w = 0;
                    for (int64_t j = 0; j < 4 && 4 * q + j < sk; ++j) {
                        const int64_t off = (nd == 3 ? b * sf.strides[0] : 0) + (i / gmn) * sf.strides[nd - 2] +
                                            (4 * q + j) * sf.strides[nd - 1];
                        w |= (uint32_t)exp_byte(buf[off]) << (8 * j);
                    }
                    bad += ((uint32_t *)out.data)[b * aligned * pk + i + q * aligned] != w;
                }
        TU_CHECK(bad == 0, "random transform values (iter %d): %d wrong", iter, bad);
        free(out.data);
        free(buf);
    }
}

static void test_mn_major_errors(void) {
    float data[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    const dg_tensor sf = dg_tensor_2d(data, DG_FLOAT32, 2, 4);
    dg_tensor out = empty_out();
    TU_CHECK_OK(dg_get_mn_major_tma_aligned_tensor(&sf, &out));
    alloc_out(&out, 0x21);
    void *snap = tu_snapshot(&out);
    CHECK_FAIL(dg_get_mn_major_tma_aligned_tensor(NULL, &out), DG_ERR_NULL_POINTER, "sf");
    CHECK_FAIL(dg_get_mn_major_tma_aligned_tensor(&sf, NULL), DG_ERR_NULL_POINTER, "out");
    const dg_tensor sf_i = dg_tensor_2d(data, DG_INT32, 2, 4);
    CHECK_FAIL(dg_get_mn_major_tma_aligned_tensor(&sf_i, &out), DG_ERR_DTYPE, "sf");
    const dg_tensor sf_1 = dg_tensor_1d(data, DG_FLOAT32, 8);
    CHECK_FAIL(dg_get_mn_major_tma_aligned_tensor(&sf_1, &out), DG_ERR_SHAPE, "sf");
    dg_tensor o2 = out;
    o2.shape[1] = 3;
    CHECK_FAIL(dg_get_mn_major_tma_aligned_tensor(&sf, &o2), DG_ERR_SHAPE, "out");
    o2 = out;
    o2.strides[1] = 2;
    CHECK_FAIL(dg_get_mn_major_tma_aligned_tensor(&sf, &o2), DG_ERR_LAYOUT, "out");
    o2 = out;
    o2.data = data;
    CHECK_FAIL(dg_get_mn_major_tma_aligned_tensor(&sf, &o2), DG_ERR_LAYOUT, "out");
    TU_CHECK(tu_unchanged(&out, snap), "bad calls leave out untouched");
    const dg_tensor sf_p = dg_tensor_2d(data, DG_INT32, 2, 4);
    CHECK_FAIL(dg_get_mn_major_tma_aligned_packed_ue8m0_tensor(&sf_p, NULL, &out), DG_ERR_DTYPE, "sf");
    CHECK_FAIL(dg_get_mn_major_tma_aligned_packed_ue8m0_tensor(NULL, NULL, &out), DG_ERR_NULL_POINTER, "sf");
    CHECK_FAIL(dg_get_mn_major_tma_aligned_packed_ue8m0_tensor(&sf, NULL, NULL), DG_ERR_NULL_POINTER, "out");
    TU_CHECK(tu_unchanged(&out, snap), "bad packed calls leave out untouched");
    free(snap);
    free(out.data);
}

int main(void) {
    test_tma_aligned_size();
    test_mn_major_fixed();
    test_mn_major_random();
    test_mn_major_errors();
    test_packed_fixed();
    test_packed_psum();
    test_packed_random();
    test_k_grouped_fixed();
    test_k_grouped_random();
    test_transform_fixed();
    test_transform_errors();
    test_transform_random();
    return tu_finish();
}
