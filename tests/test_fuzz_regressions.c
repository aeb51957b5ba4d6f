/*
 * test_fuzz_regressions.c - argument-checking defects found by the libFuzzer harnesses
 * (tests/fuzz/), each reduced to the call that reached it. In a DG_SANITIZE build a regression
 * is a sanitizer report; in any build the status and message are checked.
 */
#include "core/internal.h" /* dg_alloc_fail_nth: checks that a call allocates nothing */
#include "test_util.h"

#include <string.h>

static void expect(dg_status got, dg_status want, const char *arg, const char *what) {
    const char *msg = dg_last_error();
    TU_CHECK(got == want && strstr(msg, arg), "%s: got %s want %s, message \"%s\" (should name %s)", what,
             dg_status_string(got), dg_status_string(want), msg, arg);
}

/* fuzz_gemm_dense: a BF16 tensor whose data pointer is one byte off its 2-byte elements was
 * accepted and read as uint16_t (UBSan: misaligned load in dg_load_float). Now DG_ERR_LAYOUT. */
static void test_misaligned_data(void) {
    static uint16_t a[4 * 8 + 1], b[3 * 8];
    static float d[4 * 3 + 1];
    dg_tensor ta = dg_tensor_2d((char *)a + 1, DG_BFLOAT16, 4, 8);
    dg_tensor tb = dg_tensor_2d(b, DG_BFLOAT16, 3, 8);
    dg_tensor td = dg_tensor_2d(d, DG_FLOAT32, 4, 3);
    expect(dg_bf16_gemm_nt(&ta, &tb, &td, NULL), DG_ERR_LAYOUT, "'a'", "misaligned a");
    ta.data = a;
    td.data = (char *)d + 2;
    expect(dg_bf16_gemm_nt(&ta, &tb, &td, NULL), DG_ERR_LAYOUT, "'d'", "misaligned d");
    td.data = d;
    TU_CHECK_OK(dg_bf16_gemm_nt(&ta, &tb, &td, NULL));
    /* one-byte dtypes have no alignment to keep */
    static uint8_t x[9];
    static float sf[1];
    dg_tensor tx = dg_tensor_2d(x + 1, DG_FLOAT8_E4M3, 1, 8), tsf = dg_tensor_2d(sf, DG_FLOAT32, 1, 1);
    dg_tensor tf = dg_tensor_2d((char *)d + 1, DG_FLOAT32, 1, 8);
    expect(dg_per_token_cast_to_fp8(&tf, 0, 128, 0, &tx, &tsf), DG_ERR_LAYOUT, "'x'", "misaligned x");
}

/* fuzz_mqa: an empty q (S = 0) claiming 2^57 heads of 64 elements passed the span checks, and
 * the reference backend's H x D buffer size overflowed (UBSan: signed overflow, ref_mqa.c). */
static void test_mqa_empty_q_huge_heads(void) {
    static uint8_t kv[64];
    static float kv_sf[1], w[1], logits[1];
    static int32_t ks[1], ke[1];
    const int64_t huge = (int64_t)1 << 57;
    int64_t qs[3] = {0, huge, 64};
    dg_tensor q = dg_tensor_make(NULL, DG_FLOAT8_E4M3, 3, qs);
    dg_tensor tkv = dg_tensor_2d(kv, DG_FLOAT8_E4M3, 1, 64), tsf = dg_tensor_1d(kv_sf, DG_FLOAT32, 1);
    dg_tensor tw = dg_tensor_2d(w, DG_FLOAT32, 0, huge), tks = dg_tensor_1d(ks, DG_INT32, 0),
              tke = dg_tensor_1d(ke, DG_INT32, 0), tl = dg_tensor_2d(logits, DG_FLOAT32, 0, 1);
    for (int backend = 0; backend < 2; ++backend) {
        dg_set_backend(backend ? DG_BACKEND_REFERENCE : DG_BACKEND_AUTO);
        expect(dg_fp8_mqa_logits(&q, &tkv, &tsf, &tw, &tks, &tke, 1, 0, &tl), DG_ERR_OVERFLOW, "'q'",
               "S = 0, H = 2^57");
    }
    dg_set_backend(DG_BACKEND_AUTO);
}

/* fuzz_quant: x [M, 0] with NULL data (no element) reached the fast per-token kernel, which
 * formed row pointers from NULL (UBSan: applying zero offset to null pointer, quant.c). */
static void test_quant_empty_null_data(void) {
    dg_tensor x = dg_tensor_2d(NULL, DG_FLOAT32, 4, 0);
    dg_tensor out = dg_tensor_2d(NULL, DG_FLOAT8_E4M3, 4, 0), sf = dg_tensor_2d(NULL, DG_FLOAT32, 4, 0);
    for (int backend = 0; backend < 2; ++backend) {
        dg_set_backend(backend ? DG_BACKEND_REFERENCE : DG_BACKEND_AUTO);
        static uint8_t one;
        out.data = &one; /* not a query: empty outputs with some pointer */
        static float none;
        sf.data = &none;
        TU_CHECK_OK(dg_per_token_cast_to_fp8(&x, 1, 128, 0, &out, &sf));
    }
    dg_set_backend(DG_BACKEND_AUTO);
}

/* found by this file's first version: dg_tensor_make's row-major strides overflowed int64 for
 * shapes whose product does not fit (UBSan, tensor.c); they now saturate and are refused. */
static void test_tensor_make_huge(void) {
    int64_t s[3] = {2, (int64_t)1 << 57, 64};
    static float x[1], out[1];
    dg_tensor t = dg_tensor_make(x, DG_FLOAT32, 3, s), o = dg_tensor_1d(out, DG_FLOAT32, 1);
    TU_CHECK(t.strides[0] == INT64_MAX, "stride[0] %lld", (long long)t.strides[0]);
    expect(dg_ceil_to_ue8m0_tensor(&t, &o), DG_ERR_OVERFLOW, "'x'", "shape product past int64");
}

/* fuzz_gemm_grouped: a BF16 b [2^62, 1, 1] broadcast along G (stride 0, 2 bytes of memory)
 * was accepted by dg_pack_b_grouped, and the engine's G x per-group size overflowed to a tiny
 * buffer it then overran (ASan: heap-buffer-overflow, engine/grouped_packed.c). Now refused. */
static void test_pack_b_grouped_broadcast_huge(void) {
    static uint16_t w[1];
    dg_tensor b = dg_tensor_3d(w, DG_BFLOAT16, (int64_t)1 << 62, 1, 1);
    b.strides[0] = 0;
    dg_packed_b *p = NULL;
    expect(dg_pack_b_grouped(&b, NULL, NULL, &p), DG_ERR_OVERFLOW, "'b'", "G = 2^62 broadcast");
    TU_CHECK(p == NULL, "no object on failure");
    dg_tensor bd = dg_tensor_2d(w, DG_BFLOAT16, (int64_t)1 << 60, 1);
    bd.strides[0] = 0;
    expect(dg_pack_b(&bd, NULL, NULL, &p), DG_ERR_OVERFLOW, "'b'", "N = 2^60 broadcast");
    dg_tensor be = dg_tensor_2d(w, DG_BFLOAT16, 0, INT64_MAX); /* empty; K rounded up overflowed */
    expect(dg_pack_b(&be, NULL, NULL, &p), DG_ERR_OVERFLOW, "'b'", "N = 0, K = 2^63 - 1");
    b.shape[0] = 3; /* small broadcast G still packs */
    TU_CHECK_OK(dg_pack_b_grouped(&b, NULL, NULL, &p));
    dg_packed_b_free(p);
}

/* fuzz_hc_einsum: "bhd,hdr->bhr" with B = D = R = 0 and H = 2^32 - 18 (all tensors empty)
 * walked every head in the reference loops: a hang of minutes. Now returns at once. */
static void test_einsum_empty_many_heads(void) {
    static uint16_t x[1];
    const int64_t h = ((int64_t)1 << 32) - 18;
    dg_tensor a = dg_tensor_3d(x, DG_BFLOAT16, 0, h, 0), b = dg_tensor_3d(x, DG_BFLOAT16, h, 0, 0),
              d = dg_tensor_3d(x, DG_BFLOAT16, 0, h, 0);
    for (int backend = 0; backend < 2; ++backend) {
        dg_set_backend(backend ? DG_BACKEND_REFERENCE : DG_BACKEND_AUTO);
        TU_CHECK_OK(dg_einsum("bhd,hdr->bhr", &a, &b, &d, NULL));
    }
    dg_set_backend(DG_BACKEND_AUTO);
}

/* fuzz_gemm_dense: head_splits (INT_MAX, 0, INT_MAX) overflowed int in the left + right > 0
 * check of dg_fp8_gemm_nt_skip_head_mid (UBSan, gemm_dense.c). Now a plain shape error. */
static void test_skip_head_mid_int_splits(void) {
    static uint8_t a[128], b[128];
    static float sf[2], d[4];
    dg_tensor ta = dg_tensor_2d(a, DG_FLOAT8_E4M3, 1, 128), tb = dg_tensor_2d(b, DG_FLOAT8_E4M3, 1, 128);
    dg_tensor sa = dg_tensor_2d(sf, DG_FLOAT32, 1, 1), sb = dg_tensor_2d(sf, DG_FLOAT32, 1, 1);
    dg_tensor td = dg_tensor_2d(d, DG_FLOAT32, 1, 4);
    const int hs[3] = {INT32_MAX, 0, INT32_MAX};
    expect(dg_fp8_gemm_nt_skip_head_mid(&ta, &sa, &tb, &sb, &td, hs, NULL), DG_ERR_SHAPE, "'b'", "INT_MAX splits");
}

/* fuzz_quant: dg_cast_back_from_fp4 doubled an empty packed [0, 2^63 - 1]'s byte extent in
 * int64 (UBSan, quant.c). Now DG_ERR_OVERFLOW. */
static void test_cast_back_fp4_doubling(void) {
    static uint8_t p[1];
    static float sf[1], out[1];
    dg_tensor tp = dg_tensor_2d(p, DG_FP4_E2M1X2, 0, INT64_MAX), ts = dg_tensor_2d(sf, DG_FLOAT32, 0, 1);
    dg_tensor to = dg_tensor_2d(out, DG_FLOAT32, 0, 1);
    expect(dg_cast_back_from_fp4(&tp, &ts, 32, 0, &to), DG_ERR_OVERFLOW, "'packed'", "N = 2 (2^63 - 1)");
}

/* fuzz_sf_layout: an empty FLOAT32 sf [2^34 - 1, 16, 0] made the packed-UE8M0 value check walk
 * 2^38 (g, i) pairs with nothing to check: a hang. Now answers at once. */
static void test_packed_ue8m0_empty_many_groups(void) {
    static float sf[1];
    dg_tensor t = dg_tensor_3d(sf, DG_FLOAT32, ((int64_t)1 << 34) - 1, 16, 0);
    dg_tensor out;
    memset(&out, 0, sizeof out);
    TU_CHECK_OK(dg_get_mn_major_tma_aligned_packed_ue8m0_tensor(&t, NULL, &out));
}

/* fuzz_sf_layout: an empty sf [0, 154641101568] with a psum layout of empty groups made the
 * k-grouped packer's value check walk every column of its unowned packed rows: a hang. The
 * query form now answers at once (the output itself could never be allocated). */
static void test_k_grouped_empty_huge_mn(void) {
    static float sf[1];
    static int32_t layout[66];
    const int64_t mn = 154641101568;
    dg_tensor ts = dg_tensor_2d(sf, DG_FLOAT32, 0, mn);
    dg_tensor tl = dg_tensor_1d(layout, DG_INT32, 66);
    dg_tensor out;
    memset(&out, 0, sizeof out);
    TU_CHECK_OK(dg_get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(&ts, &tl, NULL, 0, 128, 128, 1, &out));
    TU_CHECK(out.shape[0] == (3 * 66) / 4 && out.shape[1] == mn, "k-grouped query: got [%lld, %lld]",
             (long long)out.shape[0], (long long)out.shape[1]);
}

/* fuzz_mqa: an empty q (S = 0) with 2^25 heads of 64 (a size that passes the checks) made the
 * reference backend allocate its H x D query buffer, 17 GB, before finding no row to compute. */
static void test_mqa_ref_empty_q_many_heads(void) {
    static uint8_t kv[64];
    static float kv_sf[1], w[1], logits[1];
    static int32_t ks[1], ke[1];
    const int64_t heads = (int64_t)1 << 25;
    int64_t qs[3] = {0, heads, 64};
    dg_tensor q = dg_tensor_make(NULL, DG_FLOAT8_E4M3, 3, qs);
    dg_tensor tkv = dg_tensor_2d(kv, DG_FLOAT8_E4M3, 1, 64), tsf = dg_tensor_1d(kv_sf, DG_FLOAT32, 1);
    dg_tensor tw = dg_tensor_2d(w, DG_FLOAT32, 0, heads), tks = dg_tensor_1d(ks, DG_INT32, 0),
              tke = dg_tensor_1d(ke, DG_INT32, 0), tl = dg_tensor_2d(logits, DG_FLOAT32, 0, 1);
    TU_CHECK_OK(dg_fp8_mqa_logits(&q, &tkv, &tsf, &tw, &tks, &tke, 1, 0, &tl));
    dg_set_backend(DG_BACKEND_REFERENCE);
    dg_alloc_fail_nth(1); /* any allocation would fail the call */
    TU_CHECK_OK(dg_fp8_mqa_logits(&q, &tkv, &tsf, &tw, &tks, &tke, 1, 0, &tl));
    TU_CHECK(dg_alloc_fail_pending(), "the reference backend allocated for an empty query");
    dg_alloc_fail_nth(0);
    dg_set_backend(DG_BACKEND_AUTO);
}

/* fuzz_gemm_dense: dg_pack_b of an empty BF16 b [0, 2^33 + 255] sized its staging rows by K and
 * touched 2.1 GB; FP8 b [32, 0] with float32 scales [32, 0] of NULL data (no element) formed
 * row pointers from NULL (UBSan) when the engine checked whether its scales are powers of two,
 * packed or not (dg_fp8_gemm_tt with K = 0). Both now finish at once without touching memory. */
static void test_pack_empty_b(void) {
    dg_tensor b = dg_tensor_2d(NULL, DG_BFLOAT16, 0, ((int64_t)1 << 33) + 255);
    dg_packed_b *p = NULL;
    dg_alloc_fail_nth(3); /* the packed object's own blocks only, no K-sized staging */
    TU_CHECK_OK(dg_pack_b(&b, NULL, NULL, &p));
    TU_CHECK(dg_alloc_fail_pending(), "packing an empty B allocated more than its object");
    dg_alloc_fail_nth(0);
    dg_packed_b_free(p);
    p = NULL;
    dg_tensor b8 = dg_tensor_2d(NULL, DG_FLOAT8_E4M3, 32, 0), sf = dg_tensor_2d(NULL, DG_FLOAT32, 1, 0);
    static float a8[1];
    dg_tensor a = dg_tensor_2d(a8, DG_FLOAT8_E4M3, 4, 0), sfa = dg_tensor_2d(a8, DG_FLOAT32, 4, 0);
    TU_CHECK_OK(dg_pack_b(&b8, &sf, NULL, &p));
    dg_packed_b_free(p);
    static uint16_t d[4 * 32];
    dg_tensor td = dg_tensor_2d(d, DG_BFLOAT16, 4, 32);
    TU_CHECK_OK(dg_fp8_gemm_nt(&a, &sfa, &b8, &sf, &td, NULL, NULL));
    int zero = 1;
    for (int i = 0; i < 4 * 32; ++i)
        zero &= d[i] == 0;
    TU_CHECK(zero, "K = 0 gives D = 0");
}

/* fuzz_hc_einsum (offline run): "bmk,bnk->mn" with S = 0 and K = 2^63 - 1 (a, b empty, d [2, 3]
 * real) rounded K up to whole k pairs in the engine's packer: signed overflow (UBSan,
 * dg_pack_kp). Now d = c (or 0) directly, on both backends. */
static void test_einsum_empty_s_huge_k(void) {
    static uint16_t x[1];
    static float dd[6], cc[6] = {1, 2, 3, 4, 5, 6};
    dg_tensor a = dg_tensor_3d(x, DG_BFLOAT16, 0, 2, INT64_MAX), b = dg_tensor_3d(x, DG_BFLOAT16, 0, 3, INT64_MAX);
    dg_tensor d = dg_tensor_2d(dd, DG_FLOAT32, 2, 3), c = dg_tensor_2d(cc, DG_FLOAT32, 2, 3);
    for (int backend = 0; backend < 2; ++backend) {
        dg_set_backend(backend ? DG_BACKEND_REFERENCE : DG_BACKEND_AUTO);
        TU_CHECK_OK(dg_einsum("bmk,bnk->mn", &a, &b, &d, &c));
        TU_CHECK(memcmp(dd, cc, sizeof dd) == 0, "backend %d: d = c", backend);
        TU_CHECK_OK(dg_einsum("bmk,bnk->mn", &a, &b, &d, NULL));
        TU_CHECK(dd[0] == 0 && dd[5] == 0, "backend %d: d = 0", backend);
    }
    dg_set_backend(DG_BACKEND_AUTO);
}

/* fuzz_quant (CI's fixed-seed run): dg_per_token_cast_to_fp4 of an empty x [0, 2^63 - 2] with
 * gran_k = 9 (an odd number of blocks of odd size) formed blocks * gran_k for its error message:
 * signed overflow (UBSan). The message now gives K and the block count. */
static void test_fp4_cast_odd_padding_huge_k(void) {
    static uint16_t x[1];
    dg_tensor tx = dg_tensor_2d(x, DG_BFLOAT16, 0, INT64_MAX - 1), out, sf;
    memset(&out, 0, sizeof out);
    memset(&sf, 0, sizeof sf);
    expect(dg_per_token_cast_to_fp4(&tx, 0, 9, 0, &out, &sf), DG_ERR_VALUE, "'gran_k'", "K = 2^63 - 2, gran_k = 9");
}

/* fuzz_hc_einsum (CI's fixed-seed run): a heads-form einsum with an empty batch and a head stride
 * of 2^62 (legal: nothing steps by it) doubled that stride into bytes to order the engine's tile
 * walk: signed overflow (UBSan, batched.c group_stride_bytes). The distances now saturate. */
static void test_einsum_empty_batch_huge_head_stride(void) {
    static uint16_t x[64];
    dg_tensor a = dg_tensor_3d(x, DG_BFLOAT16, 0, 2, 4), b = dg_tensor_3d(x, DG_BFLOAT16, 2, 3, 4),
              d = dg_tensor_3d(x + 32, DG_BFLOAT16, 0, 2, 3);
    a.strides[1] = (int64_t)1 << 62;
    for (int backend = 0; backend < 2; ++backend) {
        dg_set_backend(backend ? DG_BACKEND_REFERENCE : DG_BACKEND_AUTO);
        const dg_status st = dg_einsum("bhr,hdr->bhd", &a, &b, &d, NULL);
        TU_CHECK(st == DG_OK || st == DG_ERR_LAYOUT || st == DG_ERR_OVERFLOW, "backend %d: %s: %s", backend,
                 dg_status_string(st), dg_last_error());
    }
    dg_set_backend(DG_BACKEND_AUTO);
}

/* fuzz_quant (CI's fixed-seed run): dg_per_custom_dims_cast_to_fp8 of an empty x (a kept
 * dimension of 0) whose first dimension, 1111551 long, has stride 2^63 - 1 (legal: nothing
 * steps by it) multiplied the two to flatten x for the per-token kernels: signed overflow
 * (UBSan, quant.c flatten_2d). Empty or unflattenable tensors now take the reference walk. */
static void test_custom_dims_empty_huge_stride(void) {
    static float x[4], s[1];
    static uint8_t q[4];
    dg_tensor tx = dg_tensor_3d(x, DG_FLOAT32, 1111551, 0, 4), out = dg_tensor_3d(q, DG_FLOAT8_E4M3, 1111551, 0, 4);
    dg_tensor sf = dg_tensor_2d(s, DG_FLOAT32, 1111551, 0);
    tx.strides[0] = out.strides[0] = sf.strides[0] = INT64_MAX;
    const int dims[2] = {0, 1};
    const dg_status st = dg_per_custom_dims_cast_to_fp8(&tx, dims, 2, 0, &out, &sf);
    TU_CHECK(st == DG_OK || st == DG_ERR_LAYOUT || st == DG_ERR_OVERFLOW || st == DG_ERR_SHAPE, "%s: %s",
             dg_status_string(st), dg_last_error());
}

int main(int argc, char **argv) {
    static const struct { const char *name; void (*run)(void); } groups[] = {
        {"misaligned_data", test_misaligned_data},
        {"mqa_empty_q_huge_heads", test_mqa_empty_q_huge_heads},
        {"quant_empty_null_data", test_quant_empty_null_data},
        {"custom_dims_empty_huge_stride", test_custom_dims_empty_huge_stride},
        {"tensor_make_huge", test_tensor_make_huge},
        {"pack_b_grouped_broadcast_huge", test_pack_b_grouped_broadcast_huge},
        {"einsum_empty_many_heads", test_einsum_empty_many_heads},
        {"skip_head_mid_int_splits", test_skip_head_mid_int_splits},
        {"cast_back_fp4_doubling", test_cast_back_fp4_doubling},
        {"packed_ue8m0_empty_many_groups", test_packed_ue8m0_empty_many_groups},
        {"k_grouped_empty_huge_mn", test_k_grouped_empty_huge_mn},
        {"mqa_ref_empty_q_many_heads", test_mqa_ref_empty_q_many_heads},
        {"pack_empty_b", test_pack_empty_b},
        {"einsum_empty_s_huge_k", test_einsum_empty_s_huge_k},
        {"fp4_cast_odd_padding_huge_k", test_fp4_cast_odd_padding_huge_k},
        {"einsum_empty_batch_huge_head_stride", test_einsum_empty_batch_huge_head_stride},
    };
    for (size_t i = 0; i < sizeof groups / sizeof groups[0]; ++i)
        if (argc < 2 || strstr(groups[i].name, argv[1]))
            groups[i].run();
    return tu_finish();
}
