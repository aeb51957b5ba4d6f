/*
 * test_engine_smallm.c - the small-M paths (decoding, M <= 64; src/engine/smallm.c, its decode
 * kernels for M <= 2, and the small-M part of src/engine/prepack.c) against the large-M path
 * of the same ISA level, on every level from AVX2 up that this CPU runs: rows of D computed
 * with M = 1 .. 64 (unpacked B and pre-packed B, 1, 2 and 3 threads, decode kernels on and
 * off) are bitwise the same rows computed inside one large-M call (M = 200, or past the level's
 * small-M bound), for BF16 (K- and MN-major
 * B), FP8 1D2D float scales, FP8 UE8M0, FP8 x FP4 (gran 32, UE8M0 and float scales), with K
 * and N tails and padded B rows, and K in whole AMX k steps (B's codes widened in the tile loop
 * there); and within DeepGEMM's calc_diff thresholds of exact math on
 * the same values, with the AVX-512 BF16 kernels reading B's rows in place and staged into L1.
 * Then the decode kernels' exact fallbacks: FP8 B with NaN codes, and folded
 * scales too large for one exact multiply; and tiny BF16 inputs whose products are float32
 * denormals, bitwise across M too (at AVX-512 BF16 both paths run VDPBF16PS, which flushes them).
 */
#include "test_gemm_dense_util.h"

#include "engine/engine.h"

typedef struct scase {
    const char *what;
    dg_dtype da, db;
    int gran_a[2], gran_b[2], packed, b_mn_major;
    double max_diff;
    int sf_mn_major; /* B's scales MN-major (DeepGEMM's layout for weights; the decode kernels read them in place) */
} scase;

static dg_gemm_options opts_of(const scase *c) {
    dg_gemm_options o = dg_gemm_options_default();
    o.recipe_a[0] = c->gran_a[0], o.recipe_a[1] = c->gran_a[1];
    o.recipe_b[0] = c->gran_b[0], o.recipe_b[1] = c->gran_b[1];
    return o;
}

/* Rows [r0, r0 + m) of operand a (data and per-row scales). */
static void view_rows(const top *a, int64_t r0, int64_t m, dg_tensor *t, dg_tensor *sf) {
    *t = a->t;
    t->data = (char *)t->data + r0 * t->strides[0] * (int64_t)dg_dtype_size(t->dtype);
    t->shape[0] = m;
    *sf = a->sf;
    if (a->dt != DG_BFLOAT16) {
        sf->data = (char *)sf->data + r0 * sf->strides[0] * 4;
        sf->shape[0] = m;
    }
}

/* D = A @ B^T (pb: pre-packed B, else B itself). */
static dg_tensor gemm(const scase *c, const dg_tensor *a, const dg_tensor *sfa, const top *b, const dg_packed_b *pb) {
    dg_tensor d = tu_alloc2(DG_FLOAT32, a->shape[0], b->mn);
    const dg_gemm_options o = opts_of(c);
    dg_status st;
    if (c->da == DG_BFLOAT16)
        st = pb ? dg_bf16_gemm_nt_packed(a, pb, &d, NULL) : dg_bf16_gemm_nt(a, &b->t, &d, NULL);
    else
        st = pb ? dg_fp8_fp4_gemm_nt_packed(a, sfa, pb, &d, NULL, &o) : dg_fp8_fp4_gemm_nt(a, sfa, &b->t, &b->sf, &d, NULL, &o);
    TU_CHECK(st == DG_OK, "%s: %s", c->what, dg_last_error());
    return d;
}

static int rows_equal(const dg_tensor *x, int64_t rx, const dg_tensor *y, int64_t ry) {
    return memcmp((const float *)x->data + rx * x->strides[0], (const float *)y->data + ry * y->strides[0],
                  (size_t)x->shape[1] * sizeof(float)) == 0;
}

/* calc_diff of rows [r0, r0 + m) of d against exact math on the operands' values. */
static double diff_vs_exact(const top *a, int64_t r0, const top *b, const dg_tensor *d) {
    const int64_t m = d->shape[0], n = b->mn;
    float *want = malloc((size_t)(m * n) * sizeof(float)), *got = malloc((size_t)(m * n) * sizeof(float));
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
            double s = 0;
            for (int64_t kk = 0; kk < a->k; ++kk)
                s += (double)a->val[(r0 + i) * a->k + kk] * b->val[j * b->k + kk];
            want[i * n + j] = (float)s;
            got[i * n + j] = ((const float *)d->data)[i * d->strides[0] + j];
        }
    const double diff = tu_calc_diff(got, want, (size_t)(m * n));
    free(want);
    free(got);
    return diff;
}

/* Special contents: B for the decode kernels' fallbacks; tiny BF16 A and B whose products and
 * partial sums are float32 denormals (flushed by VDPBF16PS: the small-M path must flush the same). */
enum { PLAIN = 0, NAN_CODES = 1, BIG_SCALES = 2, TINY_VALUES = 3, HUGE_SCALES = 4, TINY_SCALES = 5, EDGE_HIGH = 6,
       EDGE_LOW = 7, ODD_SCALE = 8, ODD_SCALE_TAIL = 9, SUBNORMAL_CODES = 10 };
/* ODD_SCALE / ODD_SCALE_TAIL: float32 powers of two but one scale times 1 + 2^-10, in a row of a whole
 * 16-row block (row 40) or in the last row: B's scales then cannot be folded, which the AMX
 * small-M path, assuming they can (dg_engine_gemm_small_assume_pow2), finds out mid-call. */
/* EDGE_HIGH / EDGE_LOW: the largest and smallest folded E2M1 scales the AVX-512 BF16 decode
 * kernels take on their fast path (2^125 and 2^-100: the ends of their exponent arithmetic). */
static const uint32_t kSpecialScaleByte[11] = {0, 0, 147u, 0, 253u, 20u, 252u, 27u, 0, 0, 0};

/* Every BF16 value of x times 2^-64 (exactly: the exponent field lowered; below the normal
 * range the value becomes a signed zero), so that products fall around 2^-128. */
static void make_tiny(top *x) {
    for (int64_t i = 0; i < x->mn; ++i)
        for (int64_t kk = 0; kk < x->k; ++kk) {
            uint16_t *h = (uint16_t *)x->t.data + i * x->t.strides[0] + kk * x->t.strides[1];
            const int e = (*h >> 7) & 0xff;
            *h = e > 64 ? (uint16_t)(*h - (64 << 7)) : (uint16_t)(*h & 0x8000);
        }
}

/* One E4M3 NaN code (S.1111.111) in every third row of b, at a row-dependent k. */
static void put_nans(top *b) {
    for (int64_t i = 0; i < b->mn; i += 3)
        ((uint8_t *)b->mem)[i * b->t.strides[0] + (i * 7) % b->k] = (uint8_t)(i & 1 ? 0xff : 0x7f);
}

/* SUBNORMAL_CODES: E4M3 zeros and subnormals (S.0000.mmm, both signs) at every other k of the
 * first half of K, none in the second: the AVX2 / AVX-512 staging converts steps holding one
 * without multiplying a subnormal float (decode_avx512.c), the others by the product. */
static void put_subnormals(top *b) {
    for (int64_t i = 0; i < b->mn; ++i)
        for (int64_t kk = 0; kk < b->k / 2; kk += 2)
            ((uint8_t *)b->mem)[i * b->t.strides[0] + kk] = (uint8_t)(((i + kk) % 8) | ((i + kk / 2) % 2 ? 0x80 : 0));
}

/* A packed UE8M0 scale (byte: 147 = 2^20, 253 = 2^126, 20 = 2^-107) for the first K block of
 * every other row of b: 2^20 is beyond one exact multiply in the AVX2 decode kernels, 2^126
 * makes E2M1 values overflow BF16 in the AVX-512 ones, 2^-107 is below what one multiply keeps
 * normal (the driver's check; for pre-packed FP4 panels, made at packing), so those blocks take
 * the exact path. */
static void put_big_scales(top *b, uint32_t byte) {
    for (int64_t i = 0; i < b->sf.shape[0]; i += 2) {
        uint32_t *w = (uint32_t *)b->sf.data + i * b->sf.strides[0];
        *w = b->sf.dtype == DG_FLOAT32 ? byte << 23 : (*w & ~0xffu) | byte; /* float scales: 2^(byte - 127) */
    }
}

/* The float32 scale of B row `row`'s last K block times 1 + 2^-10 (sf: the logical [rows, blocks] view):
 * folded into E2M1 values it rounds in BF16, so a wrongly folded scale changes D. */
static void put_odd_scale(top *b, int64_t row) {
    const dg_tensor *sf = &b->sf;
    ((float *)sf->data)[row * sf->strides[0] + (sf->shape[1] - 1) * sf->strides[1]] *= 1.0f + 0x1p-10f;
}

static void check_special(const scase *c, int64_t n, int64_t k, tu_rng *r, int special);

static void check(const scase *c, int64_t n, int64_t k, tu_rng *r) { check_special(c, n, k, r, PLAIN); }

static void check_special(const scase *c, int64_t n, int64_t k, tu_rng *r, int special) {
    /* M of the reference call: past the level's small-M bound (AVX2: 256), on the large-M path */
    const int64_t limit = dg_engine_small_m_max(dg_engine_config(dg_get_isa()));
    const int64_t big = limit + 8 > 200 ? limit + 8 : 200;
    if (!top_layout_ok(c->db, n, k, c->b_mn_major) || !top_layout_ok(c->da, big, k, 0))
        return;
    top a = top_make(r, c->da, big, k, 0, c->gran_a[0], c->gran_a[1], c->packed, 0);
    top b = top_make(r, c->db, n, k, c->b_mn_major, c->gran_b[0], c->gran_b[1], c->packed, c->sf_mn_major);
    if (special == NAN_CODES)
        put_nans(&b);
    if (special == SUBNORMAL_CODES)
        put_subnormals(&b);
    if (kSpecialScaleByte[special])
        put_big_scales(&b, kSpecialScaleByte[special]);
    if (special == ODD_SCALE || special == ODD_SCALE_TAIL)
        put_odd_scale(&b, special == ODD_SCALE ? 40 : n - 1);
    if (special == TINY_VALUES)
        make_tiny(&a), make_tiny(&b);
    dg_packed_b *pb = NULL;
    const dg_gemm_options o = opts_of(c);
    TU_CHECK_OK(c->db == DG_BFLOAT16 ? dg_pack_b(&b.t, NULL, NULL, &pb) : dg_pack_b(&b.t, &b.sf, &o, &pb));
    dg_tensor at, sfa;
    view_rows(&a, 0, big, &at, &sfa);
    const int sms = dg_get_num_sms();
    TU_CHECK_OK(dg_set_num_sms(2));
    dg_tensor dbig = gemm(c, &at, &sfa, &b, NULL);
    if (special == TINY_VALUES) { /* the inputs are not flushed away entirely */
        int64_t nonzero = 0;
        for (int64_t i = 0; i < big * n; ++i)
            nonzero += ((const float *)dbig.data)[(i / n) * dbig.strides[0] + i % n] != 0.0f;
        TU_CHECK(nonzero > big * n / 8, "%s: tiny inputs gave only %lld nonzero outputs", c->what, (long long)nonzero);
    }

    static const int64_t kM[] = {1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 32, 33, 48, 63, 64, 1, 64, 100, 256};
    for (size_t mi = 0; mi < sizeof kM / sizeof kM[0] && kM[mi] <= limit; ++mi) {
        const int threads = 1 + (int)(mi % 3);
        {
            const int64_t m = kM[mi], r0 = (int64_t)(mi * 13 + (size_t)threads) % (big - m + 1);
            TU_CHECK_OK(dg_set_num_sms(threads));
            dg_tensor sub, subsf;
            view_rows(&a, r0, m, &sub, &subsf);
            for (int variant = 0; variant < 3; ++variant) { /* unpacked, pre-packed, unpacked without decode */
                const int prepacked = variant == 1;
                dg_engine_set_decode(variant != 2);
                dg_tensor ds = gemm(c, &sub, &subsf, &b, prepacked ? pb : NULL);
                dg_engine_set_decode(1);
                int same = 1;
                for (int64_t i = 0; i < m; ++i)
                    same &= rows_equal(&ds, i, &dbig, r0 + i);
                TU_CHECK(same, "%s %s N=%lld K=%lld M=%lld (rows from %lld) %s, %d threads: rows differ from the large-M call",
                         dg_engine_config(dg_get_isa())->name, c->what, (long long)n, (long long)k, (long long)m,
                         (long long)r0, variant == 1 ? "pre-packed" : variant ? "no decode" : "unpacked", threads);
                if (special == PLAIN && threads == 1 && (m == 1 || m == 64)) {
                    const double diff = diff_vs_exact(&a, r0, &b, &ds);
                    TU_CHECK(diff < c->max_diff, "%s N=%lld K=%lld M=%lld: calc_diff %.3g (limit %g)", c->what,
                             (long long)n, (long long)k, (long long)m, diff, c->max_diff);
                }
                tu_free(&ds);
            }
        }
    }
    TU_CHECK_OK(dg_set_num_sms(sms));
    tu_free(&dbig);
    dg_packed_b_free(pb);
    top_free(&a);
    top_free(&b);
}

#if defined(DG_HAVE_AMX)
/* The table widening of the AMX path gives the bits of the ISA widening the large-M path packs
 * with, for all 256 codes (NaN included), at every offset and length of a row piece. */
static void test_widen_e4m3(void) {
    uint8_t src[2][300];
    uint16_t want[300], got[2][320];
    for (int i = 0; i < 300; ++i)
        src[0][i] = (uint8_t)i, src[1][i] = (uint8_t)(255 - i);
    for (int n = 0; n <= 300; n += n < 40 ? 1 : 37) {
        memset(got, 0xee, sizeof got);
        dg_amx_widen_e4m3_rows(src[0], 300, 2, n, 0, got[0], 320);
        for (int r = 0; r < 2; ++r) {
            dg_widen_e4m3_avx512(src[r], n, 1.0f, want);
            TU_CHECK(memcmp(got[r], want, (size_t)n * 2) == 0 && got[r][n] == 0xeeee,
                     "E4M3 table widening differs from dg_widen_e4m3_avx512 (row %d, n %d)", r, n);
        }
    }
}
#endif

/* The levels from AVX2 up that this CPU runs (AVX-512 BF16 with either of its kernels). */
static void run_level(dg_isa isa, int dpbf16) {
    TU_CHECK_OK(dg_set_isa(isa));
    dg_engine_set_dpbf16(dpbf16);
    const scase cases[] = {
        {"bf16", DG_BFLOAT16, DG_BFLOAT16, {0, 0}, {0, 0}, 0, 0, 1e-5, 0},
        {"bf16 B mn-major", DG_BFLOAT16, DG_BFLOAT16, {0, 0}, {0, 0}, 0, 1, 1e-5, 0},
        {"fp8 1d2d float", DG_FLOAT8_E4M3, DG_FLOAT8_E4M3, {1, 128}, {128, 128}, 0, 0, 1e-3, 0},
        {"fp8 ue8m0", DG_FLOAT8_E4M3, DG_FLOAT8_E4M3, {1, 128}, {1, 128}, 1, 0, 1e-3, 0},
        {"fp8 x fp4 ue8m0/32", DG_FLOAT8_E4M3, DG_FP4_E2M1X2, {1, 32}, {1, 32}, 1, 0, 2e-2, 0},
        {"fp8 x fp4 float/32", DG_FLOAT8_E4M3, DG_FP4_E2M1X2, {1, 32}, {1, 32}, 0, 0, 2e-2, 0},
        /* blocks of 16: folded scales and accumulation blocks that end inside a decode step of 32 */
        {"fp8 x fp4 ue8m0/16", DG_FLOAT8_E4M3, DG_FP4_E2M1X2, {1, 16}, {1, 16}, 1, 0, 2e-2, 0},
        {"fp8 x fp4 float/16", DG_FLOAT8_E4M3, DG_FP4_E2M1X2, {1, 16}, {1, 16}, 0, 0, 2e-2, 0},
        /* B's scales MN-major: packed UE8M0 as DeepGEMM lays out FP4 weights' scales, and float */
        {"fp8 x fp4 ue8m0/32 sf mn-major", DG_FLOAT8_E4M3, DG_FP4_E2M1X2, {1, 32}, {1, 32}, 1, 0, 2e-2, 1},
        {"fp8 x fp4 float/16 sf mn-major", DG_FLOAT8_E4M3, DG_FP4_E2M1X2, {1, 16}, {1, 16}, 0, 0, 2e-2, 1},
        /* float32 powers of two (folded into B as UE8M0 scales are), K- and MN-major */
        {"fp8 x fp4 float pow2/32", DG_FLOAT8_E4M3, DG_FP4_E2M1X2, {1, 32}, {1, 32}, 2, 0, 2e-2, 0},
        {"fp8 x fp4 float pow2/16 sf mn-major", DG_FLOAT8_E4M3, DG_FP4_E2M1X2, {1, 16}, {1, 16}, 2, 0, 2e-2, 1},
        /* FP8 B with scales per 32 k: folded into the E4M3 rows' values (decode kernels: exponent adds) */
        {"fp8 ue8m0/32", DG_FLOAT8_E4M3, DG_FLOAT8_E4M3, {1, 32}, {1, 32}, 1, 0, 1e-3, 0},
        {"fp8 float/32", DG_FLOAT8_E4M3, DG_FLOAT8_E4M3, {1, 32}, {1, 32}, 0, 0, 1e-3, 0},
    };
    static const int64_t kN[] = {90, 16}; /* 90: a last item of 26 columns (AVX-512: 16 + 10) */
    /* 48: FP4 blocks of 16 ending inside a short K; 700: five whole K blocks of 128 and a part
     * (the decode kernels run blocks two or four at a time, then the rest one at a time) */
    /* 256, 416: whole AMX k steps (B's codes widened in the tile loop there; 416 ends inside a
     * K block of 128) */
    static const int64_t kK[] = {1, 31, 33, 48, 200, 256, 416, 600, 700};
    tu_rng r = {0xa3c5};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c)
        for (size_t ni = 0; ni < 2; ++ni)
            for (size_t ki = 0; ki < sizeof kK / sizeof kK[0]; ++ki)
                check(&cases[c], kN[ni], kK[ki], &r);
    check_special(&cases[2], 70, 600, &r, NAN_CODES);
    check_special(&cases[2], 70, 600, &r, SUBNORMAL_CODES);
    check_special(&cases[3], 90, 700, &r, SUBNORMAL_CODES);
    check_special(&cases[3], 70, 600, &r, NAN_CODES);
    check_special(&cases[3], 70, 600, &r, BIG_SCALES);
    check_special(&cases[4], 70, 600, &r, BIG_SCALES);
    check_special(&cases[4], 70, 600, &r, HUGE_SCALES);
    check_special(&cases[4], 70, 600, &r, TINY_SCALES);
    check_special(&cases[4], 70, 600, &r, EDGE_HIGH);
    check_special(&cases[4], 70, 600, &r, EDGE_LOW);
    for (int sc = 8; sc <= 11; ++sc) /* MN-major packed and float scales; float powers of two */
        for (int special = BIG_SCALES; special <= EDGE_LOW; ++special)
            if (special != TINY_VALUES)
                check_special(&cases[sc], 70, 600, &r, special);
    /* K past one AMX chunk of codes (8192): the next chunk's scale blocks and prefetches */
    check(&cases[3], 48, 8256, &r);
    check(&cases[4], 48, 8256, &r);
    check(&cases[10], 48, 8256, &r);
    for (int special = BIG_SCALES; special <= EDGE_LOW; ++special) /* whole k steps: the codes in the tile loop */
        if (special != TINY_VALUES) {
            check_special(&cases[4], 70, 640, &r, special);
            check_special(&cases[10], 70, 640, &r, special);
        }
    for (int special = ODD_SCALE; special <= ODD_SCALE_TAIL; ++special) /* float pow2 B, one scale not */
        for (int64_t kk = 600; kk <= 640; kk += 40) {
            check_special(&cases[10], 70, kk, &r, special);
            check_special(&cases[11], 70, kk, &r, special);
        }
    check_special(&cases[0], 70, 600, &r, TINY_VALUES);
    check_special(&cases[1], 16, 600, &r, TINY_VALUES);
    dg_engine_set_dpbf16(-1);
}

/* When rows are staged by default: strides that put more rows in one L1 set than its ways
 * (8 to 15 on x86: 32 to 60 KiB L1D), and not others. */
static void test_rows_crowd_l1(void) {
    TU_CHECK(dg_engine_rows_crowd_l1(4096, 32) && dg_engine_rows_crowd_l1(2048, 32) && dg_engine_rows_crowd_l1(1024, 64),
             "rows 1, 2 or 4 KiB apart should crowd L1");
    TU_CHECK(!dg_engine_rows_crowd_l1(4224, 32) && !dg_engine_rows_crowd_l1(7168, 32) && !dg_engine_rows_crowd_l1(600, 64) &&
                 !dg_engine_rows_crowd_l1(4096, 8),
             "rows 4224, 7168 or 600 bytes apart (or 8 rows) should not crowd L1");
}

int main(void) {
    const dg_isa best = dg_get_isa();
#if defined(__x86_64__) || defined(_M_X64) /* the x86 L1D geometry the rule assumes */
    test_rows_crowd_l1();
#endif
#if defined(DG_HAVE_AMX) /* where the CPU has AMX: the library selects AMX only then */
    if (best >= DG_ISA_AMX)
        test_widen_e4m3();
#endif
    for (int isa = DG_ISA_AVX2; isa <= (int)best; ++isa) {
        run_level((dg_isa)isa, 1);
        if (isa == DG_ISA_AVX512_BF16) {
            run_level((dg_isa)isa, 0);
            /* E4M3 rows widened by word tables, as on CPUs without VBMI (Cooper Lake) */
            dg_engine_set_decode_byte_tables(0);
            run_level((dg_isa)isa, 1);
            dg_engine_set_decode_byte_tables(1);
            /* E2M1 / E4M3 rows staged into L1 at every stride (K tails: lines cut short) */
            dg_engine_set_decode_stage_rows(1);
            run_level((dg_isa)isa, 1);
            dg_engine_set_decode_stage_rows(-1);
        }
    }
    if (best < DG_ISA_AVX2)
        printf("no AVX2 on this CPU: no small-M path to test\n");
    dg_set_isa(best);
    return tu_finish();
}
