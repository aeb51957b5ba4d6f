/*
 * test_hc_prenorm_fast.c - the fast dg_tf32_hc_prenorm_gemm kernels (every ISA path this CPU
 * runs, forced with dg_set_isa) against the reference backend and against float64 math:
 *   - each partial sum within a float32 error bound of the reference (which rounds the exact
 *     sum once): |fast - ref| <= (T + 8) * 2^-23 * sum |a b| + 2^-24 |ref|, the bound of float32
 *     sums of at most T + log2(lanes) terms per lane: T = K_split / 8 for the FMA kernels
 *     (lanes >= 8); T = K_split + 2 for AMX, whose three float32 accumulators per output (one
 *     per BF16 part of b) are added at the end;
 *   - the sum over the splits within DeepGEMM's calc_diff < 1e-8 of float64 math, and for AMX
 *     within 1e-12 on DeepSeek's shapes (a lost low part of b would show);
 *   - B recovered bit for bit through one-hot rows of A (1.0 once per row), with b over the
 *     float32 exponent range where AMX's BF16 parts are normal (|b| >= 2^-103) up to FLT_MAX;
 *     infinities and NaNs in b give what float64 math gives;
 *   - odd shapes: M = 1, 13, 137, K tails around the 16-element vectors and 384-element chunks,
 *     for AMX around the 16-row tiles, 32-element k steps, chunks of 6144 (K > 8192) and whole-K
 *     chunks, M > 256 (row blocks) with splits ending inside chunks, crossing them, past K, and
 *     more splits than fit the staging area of one chunk,
 *     N other than 24 (1, 7, 25, 40), strided a and d, splits with empty ranges;
 *   - the same bits for 1, 2 and 3 threads, and for one split and no split; a row's bits the
 *     same whatever M (for AMX: the transposed small-M kernel against the packed-B one);
 *   - row padding of d untouched.
 */
#include "test_util.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct shape {
    int m, n, k, splits; /* splits <= 0: unsplit */
    int a_pad, d_pad;    /* extra elements between rows of a / of d */
} shape;

/* One call's buffers: a BF16 with row stride k + a_pad, b contiguous, d [S,] M, N with row
 * stride n + d_pad (pad filled with a marker), sqr_sum contiguous. */
typedef struct bufs {
    shape c;
    int s_count;
    uint16_t *a;
    float *af, *b, *d, *s;
    dg_tensor ta, tb, td, ts;
} bufs;

static void bufs_init(bufs *x, tu_rng *rng, shape c) {
    memset(x, 0, sizeof *x);
    x->c = c;
    x->s_count = c.splits > 0 ? c.splits : 1;
    const size_t lda = (size_t)c.k + c.a_pad, ldd = (size_t)c.n + c.d_pad;
    x->a = calloc((size_t)c.m * lda + 1, 2);
    x->af = malloc((size_t)c.m * c.k * sizeof(float));
    x->b = malloc((size_t)c.n * c.k * sizeof(float));
    for (int i = 0; i < c.m; ++i)
        for (int j = 0; j < c.k; ++j) {
            const uint16_t h = dg_float_to_bf16((float)tu_normal(rng));
            x->a[i * lda + j] = h;
            x->af[(size_t)i * c.k + j] = dg_bf16_to_float(h);
        }
    tu_fill_normal(rng, x->b, (size_t)c.n * c.k, 1.0f);
    x->d = malloc((size_t)x->s_count * c.m * ldd * sizeof(float) + 4);
    x->s = malloc((size_t)x->s_count * c.m * sizeof(float) + 4);
    x->ta = dg_tensor_2d(x->a, DG_BFLOAT16, c.m, c.k);
    x->ta.strides[0] = (int64_t)lda;
    x->tb = dg_tensor_2d(x->b, DG_FLOAT32, c.n, c.k);
    if (c.splits > 0) {
        x->td = dg_tensor_3d(x->d, DG_FLOAT32, c.splits, c.m, c.n);
        x->td.strides[0] = (int64_t)c.m * (int64_t)ldd;
        x->ts = dg_tensor_2d(x->s, DG_FLOAT32, c.splits, c.m);
    } else {
        x->td = dg_tensor_2d(x->d, DG_FLOAT32, c.m, c.n);
        x->ts = dg_tensor_1d(x->s, DG_FLOAT32, c.m);
    }
    x->td.strides[x->td.ndim - 2] = (int64_t)ldd;
}

static void bufs_free(bufs *x) { free(x->a), free(x->af), free(x->b), free(x->d), free(x->s); }

static size_t d_elems(const bufs *x) { return (size_t)x->s_count * x->c.m * (x->c.n + x->c.d_pad); }
static size_t s_elems(const bufs *x) { return (size_t)x->s_count * x->c.m; }

/* Runs the call with d's bytes first set to a marker; the outputs go to d_out / s_out. */
static dg_status run(bufs *x, float *d_out, float *s_out) {
    memset(x->d, 0x7F, d_elems(x) * sizeof(float));
    memset(x->s, 0x7F, s_elems(x) * sizeof(float));
    const dg_status st = dg_tf32_hc_prenorm_gemm(&x->ta, &x->tb, &x->td, &x->ts, x->c.splits);
    memcpy(d_out, x->d, d_elems(x) * sizeof(float));
    memcpy(s_out, x->s, s_elems(x) * sizeof(float));
    return st;
}

/* The test's statement of the split rule (64-element blocks, the first blocks % S splits one more). */
static void split_bounds(int k, int splits, int s, int *k0, int *k1) {
    const int blocks = (k + 63) / 64;
    int start = 0;
    for (int i = 0; i < s; ++i)
        start += blocks / splits + (i < blocks % splits);
    const int count = blocks / splits + (s < blocks % splits);
    *k0 = start * 64 < k ? start * 64 : k;
    *k1 = (start + count) * 64 < k ? (start + count) * 64 : k;
}

/* fast (fd, fs) against the reference (rd, rs) with the error bound, and the split sums against
 * float64 with calc_diff; d's row padding must hold the marker. */
static void compare(const bufs *x, const float *fd, const float *fs, const float *rd, const float *rs,
                    dg_isa level) {
    const char *isa = dg_isa_name(level);
    const shape c = x->c;
    const int ldd = c.n + c.d_pad;
    float *sum_d = calloc((size_t)c.m * c.n, sizeof(float)), *sum_s = calloc((size_t)c.m, sizeof(float));
    float *ref_d = malloc((size_t)c.m * c.n * sizeof(float)), *ref_s = malloc((size_t)c.m * sizeof(float));
    double *d64 = calloc((size_t)c.m * c.n, sizeof(double)), *s64 = calloc((size_t)c.m, sizeof(double));
    int bad = 0, pad_bad = 0;
    double worst = 0;
    for (int sp = 0; sp < x->s_count; ++sp) {
        int k0, k1;
        split_bounds(c.k, x->s_count, sp, &k0, &k1);
        const double terms = level == DG_ISA_AMX ? (k1 - k0) + 2.0 : (k1 - k0) / 8.0;
        const double scale = (terms + 8.0) * ldexp(1.0, -23);
        for (int i = 0; i < c.m; ++i) {
            const float *ar = x->af + (size_t)i * c.k;
            double sq = 0;
            for (int j = k0; j < k1; ++j)
                sq += (double)ar[j] * ar[j];
            const size_t si = (size_t)sp * c.m + i;
            /* sum |a^2| = sq: the square sum's bound */
            bad += fabs((double)fs[si] - rs[si]) > scale * sq + ldexp(fabs(rs[si]), -24);
            sum_s[i] += fs[si];
            s64[i] += sq;
            for (int n = 0; n < c.n; ++n) {
                const float *br = x->b + (size_t)n * c.k;
                double acc = 0, mag = 0;
                for (int j = k0; j < k1; ++j) {
                    acc += (double)ar[j] * br[j];
                    mag += fabs((double)ar[j] * br[j]);
                }
                const size_t di = (size_t)sp * c.m * ldd + (size_t)i * ldd + n;
                const double err = fabs((double)fd[di] - rd[di]), lim = scale * mag + ldexp(fabs(rd[di]), -24);
                bad += !(err <= lim);
                if (lim > 0 && err / lim > worst)
                    worst = err / lim;
                sum_d[(size_t)i * c.n + n] += fd[di];
                d64[(size_t)i * c.n + n] += acc;
            }
            for (int p = 0; p < c.d_pad; ++p) {
                uint32_t u;
                memcpy(&u, &fd[(size_t)sp * c.m * ldd + (size_t)i * ldd + c.n + p], 4);
                pad_bad += u != 0x7F7F7F7Fu;
            }
        }
    }
    for (size_t i = 0; i < (size_t)c.m * c.n; ++i)
        ref_d[i] = (float)d64[i];
    for (int i = 0; i < c.m; ++i)
        ref_s[i] = (float)s64[i];
    const double diff_d = tu_calc_diff(sum_d, ref_d, (size_t)c.m * c.n), diff_s = tu_calc_diff(sum_s, ref_s, c.m);
    TU_CHECK(bad == 0, "%s m=%d n=%d k=%d splits=%d: %d sums outside the float32 bound (worst %.2f of it)", isa, c.m,
             c.n, c.k, c.splits, bad, worst);
    TU_CHECK(diff_d < 1e-8 && diff_s < 1e-8, "%s m=%d n=%d k=%d splits=%d: calc_diff d %.3g s %.3g", isa, c.m, c.n,
             c.k, c.splits, diff_d, diff_s);
    if (level == DG_ISA_AMX && c.k >= 7168)
        TU_CHECK(diff_d < 1e-12, "%s m=%d k=%d splits=%d: calc_diff d %.3g < 1e-12", isa, c.m, c.k, c.splits, diff_d);
    if (getenv("HC_TEST_VERBOSE"))
        printf("%s m=%d n=%d k=%d splits=%d: worst %.3g of the bound, calc_diff d %.3g s %.3g\n", isa, c.m, c.n, c.k,
               c.splits, worst, diff_d, diff_s);
    TU_CHECK(pad_bad == 0, "%s m=%d n=%d k=%d: row padding of d untouched", isa, c.m, c.n, c.k);
    free(sum_d), free(sum_s), free(ref_d), free(ref_s), free(d64), free(s64);
}

/* The fast path of the current ISA against the reference on one shape. */
static void check_shape(tu_rng *rng, shape c, dg_isa isa) {
    bufs x;
    bufs_init(&x, rng, c);
    float *fd = malloc(d_elems(&x) * sizeof(float)), *fs = malloc(s_elems(&x) * sizeof(float));
    float *rd = malloc(d_elems(&x) * sizeof(float)), *rs = malloc(s_elems(&x) * sizeof(float));
    TU_CHECK_OK(run(&x, fd, fs));
    TU_CHECK_OK(dg_set_backend(DG_BACKEND_REFERENCE));
    TU_CHECK_OK(run(&x, rd, rs));
    TU_CHECK_OK(dg_set_backend(DG_BACKEND_AUTO));
    compare(&x, fd, fs, rd, rs, isa);
    free(fd), free(fs), free(rd), free(rs);
    bufs_free(&x);
}

/* The same bits for 1, 2 and 3 threads, and one split equal to no split. M = 301 > 256 rows
 * (one block) takes the row-major order, with thread boundaries inside a row's splits; M = 100
 * the split-major order; M = 1, 13 and 5 (fewer splits than threads, 2N > M) threads sharing
 * the columns, N = 20 with a part that ends in a partial column group; on AMX also M = 48 and
 * 17 (the transposed kernel's rows, 16-row blocks with a tail) with shared columns, N = 40
 * (parts that cross a panel of 24) and N = 1 (fewer columns than threads). */
static void check_determinism(tu_rng *rng, const char *isa) {
    const int old = dg_get_num_sms();
    enum { NSHAPES = 10 };
    const shape shapes[NSHAPES] = {{301, 24, 1000, 3, 5, 2}, {301, 24, 1000, 0, 0, 0}, {100, 24, 2000, 5, 0, 1},
                                   {301, 24, 13000, 4, 0, 0}, {1, 24, 3000, 0, 0, 0},  {13, 24, 2100, 2, 1, 0},
                                   {5, 20, 700, 0, 0, 1},     {48, 24, 900, 0, 0, 0},  {17, 40, 650, 2, 0, 1},
                                   {3, 1, 100, 0, 0, 0}};
    for (int t = 0; t < NSHAPES; ++t) {
        bufs x;
        bufs_init(&x, rng, shapes[t]);
        float *d1 = malloc(d_elems(&x) * 4), *s1 = malloc(s_elems(&x) * 4);
        float *dn = malloc(d_elems(&x) * 4), *sn = malloc(s_elems(&x) * 4);
        TU_CHECK_OK(dg_set_num_sms(1));
        TU_CHECK_OK(run(&x, d1, s1));
        for (int threads = 2; threads <= 3; ++threads) {
            TU_CHECK_OK(dg_set_num_sms(threads));
            TU_CHECK_OK(run(&x, dn, sn));
            TU_CHECK(memcmp(d1, dn, d_elems(&x) * 4) == 0 && memcmp(s1, sn, s_elems(&x) * 4) == 0,
                     "%s splits=%d: %d threads give the bits of 1 thread", isa, shapes[t].splits, threads);
        }
        if (t == 1) { /* unsplit (in d1, s1) against one split */
            bufs y;
            shape one = shapes[1];
            one.splits = 1;
            memcpy(&y, &x, sizeof y);
            y.c = one;
            y.td = dg_tensor_3d(x.d, DG_FLOAT32, 1, one.m, one.n);
            y.ts = dg_tensor_2d(x.s, DG_FLOAT32, 1, one.m);
            TU_CHECK_OK(run(&y, dn, sn));
            TU_CHECK(memcmp(d1, dn, d_elems(&x) * 4) == 0 && memcmp(s1, sn, s_elems(&x) * 4) == 0,
                     "%s: num_splits = 1 gives the unsplit bits", isa);
        }
        free(d1), free(s1), free(dn), free(sn);
        bufs_free(&x);
    }
    TU_CHECK_OK(dg_set_num_sms(old));
}

/* One-hot rows of A (1.0 at k = 7m mod K) read b's entries back exactly: b spread over the float32
 * exponents (|b| >= 2^-103), FLT_MAX, all 24 significand bits set. Then non-finite b: with a all
 * ones, a column of b holding +inf gives +inf (not inf - inf), one holding a NaN gives NaN. */
static void check_exact_b(tu_rng *rng, const char *isa) {
    enum { M = 40, N = 24, K = 100 };
    bufs x;
    bufs_init(&x, rng, (shape){M, N, K, 0, 0, 0});
    memset(x.a, 0, (size_t)M * K * 2);
    for (int m = 0; m < M; ++m)
        x.a[m * K + (7 * m) % K] = dg_float_to_bf16(1.0f);
    for (int i = 0; i < N * K; ++i)
        x.b[i] = ldexpf((float)(1.0 + tu_uniform(rng)), (int)(tu_uniform(rng) * 227.0) - 103) * (i % 3 ? 1.0f : -1.0f);
    x.b[5] = FLT_MAX, x.b[K + 7] = -FLT_MAX;
    uint32_t ones = 0x3FFFFFFFu; /* 1.999...: every significand bit set */
    memcpy(&x.b[2 * K + 14], &ones, 4);
    float d[M * N], s[M];
    TU_CHECK_OK(run(&x, d, s));
    int bad = 0;
    for (int m = 0; m < M; ++m) {
        bad += s[m] != 1.0f;
        for (int n = 0; n < N; ++n)
            bad += memcmp(&d[m * N + n], &x.b[n * K + (7 * m) % K], 4) != 0;
    }
    TU_CHECK(bad == 0, "%s: one-hot rows of a give b bit for bit (%d wrong)", isa, bad);
    for (int i = 0; i < M * K; ++i)
        x.a[i] = dg_float_to_bf16(1.0f);
    tu_fill_normal(rng, x.b, (size_t)N * K, 1.0f);
    x.b[3 * K + 50] = INFINITY, x.b[4 * K + 99] = -INFINITY, x.b[5 * K + 31] = NAN;
    const uint32_t low_nan = 0x7F800001u; /* a NaN with only low payload bits: not an infinity */
    memcpy(&x.b[6 * K + 3], &low_nan, 4);
    TU_CHECK_OK(run(&x, d, s));
    int nf = 0;
    for (int m = 0; m < M; ++m) {
        nf += !(d[m * N + 3] == INFINITY && d[m * N + 4] == -INFINITY && isnan(d[m * N + 5]) && isnan(d[m * N + 6]));
        for (int n = 7; n < N; ++n)
            nf += !isfinite(d[m * N + n]);
    }
    TU_CHECK(nf == 0, "%s: infinities and NaNs of b propagate as in float64 math (%d wrong)", isa, nf);
    bufs_free(&x);
}

/* Batch invariance: a row's outputs do not depend on M. The first rows of a 200- or 301-row call
 * alone (a view of 13, then 40 rows): at AMX level row groups this small take the transposed
 * kernel (B A^T), the 200-row call the packed-B one (A B^T), so both must give the same bits. */
static void check_batch_invariance(tu_rng *rng, const char *isa) {
    /* M = 301 > HC_MB rows takes the row-block order (each 16-row group through its splits) */
    const int splits[3] = {0, 4, 4}, ms[3] = {200, 200, 301}, rows[2] = {13, 40};
    for (int t = 0; t < 3; ++t) {
        const int mm = ms[t];
        bufs x;
        bufs_init(&x, rng, (shape){mm, 24, 1100, splits[t], 0, 0});
        float *d = malloc(d_elems(&x) * 4), *s = malloc(s_elems(&x) * 4);
        float *d2 = malloc(d_elems(&x) * 4), *s2 = malloc(s_elems(&x) * 4);
        TU_CHECK_OK(run(&x, d, s));
        for (int v = 0; v < 2; ++v) {
            /* d: the first rows of each split in place; sqr_sum must be contiguous: s2 */
            dg_tensor ta = x.ta, td = x.td, ts = splits[t] ? dg_tensor_2d(s2, DG_FLOAT32, splits[t], rows[v])
                                                             : dg_tensor_1d(s2, DG_FLOAT32, rows[v]);
            ta.shape[0] = rows[v];
            td.shape[td.ndim - 2] = rows[v];
            memset(x.d, 0x7F, d_elems(&x) * 4);
            TU_CHECK_OK(dg_tf32_hc_prenorm_gemm(&ta, &x.tb, &td, &ts, splits[t]));
            memcpy(d2, x.d, d_elems(&x) * 4);
            int bad = 0;
            for (int sp = 0; sp < x.s_count; ++sp)
                for (int r = 0; r < rows[v]; ++r) {
                    bad += memcmp(&d[((size_t)sp * mm + r) * 24], &d2[((size_t)sp * mm + r) * 24], 24 * 4) != 0;
                    bad += memcmp(&s[sp * mm + r], &s2[sp * rows[v] + r], 4) != 0;
                }
            TU_CHECK(bad == 0, "%s splits=%d: rows of a %d-row call have the bits of a %d-row call (%d differ)", isa,
                     splits[t], rows[v], mm, bad);
        }
        free(d), free(s), free(d2), free(s2);
        bufs_free(&x);
    }
}

static void check_isa(tu_rng *rng, dg_isa isa) {
    const char *name = dg_isa_name(isa);
    const shape shapes[] = {
        /* DeepSeek's N = 24 at small M, K tails around 16 and the 384-element chunks */
        {1, 24, 100, 0, 0, 0},   {1, 24, 100, 5, 3, 1},    {13, 24, 1024, 0, 1, 0},  {13, 24, 1024, 16, 0, 3},
        {137, 24, 448, 0, 2, 5}, {137, 24, 448, 3, 0, 0},  {65, 24, 130, 4, 1, 1},   {5, 24, 383, 0, 0, 0},
        {6, 24, 385, 2, 0, 0},   {7, 24, 773, 0, 0, 0},    {3, 24, 7168, 16, 0, 0},  {2, 24, 1, 0, 0, 0},
        {3, 24, 17, 3, 0, 0},    {130, 24, 64, 1, 0, 2},
        /* other N: one column, a partial column group, more than one panel */
        {5, 1, 50, 0, 0, 0},     {9, 7, 200, 2, 1, 1},     {4, 25, 129, 0, 0, 0},    {3, 40, 1000, 16, 0, 0},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; ++i)
        check_shape(rng, shapes[i], isa);
    if (isa == DG_ISA_AMX) {
        /* 16-row tiles, 32-element k steps, chunks; DeepSeek's K with the rows of M = 137 and
         * M = 8192 (row-major blocks of 256 rows) sampled by M; M > 256 (row blocks): chunks of
         * 6144 with splits crossing them and K tails, splits past K, two panels, and 200 splits
         * (up to 96 end in one chunk) */
        const shape amx[] = {
            {16, 24, 32, 0, 0, 0},   {17, 24, 31, 0, 3, 0},  {31, 24, 33, 2, 0, 1},   {32, 24, 63, 0, 0, 0},
            {33, 24, 65, 3, 1, 0},   {48, 24, 96, 0, 0, 0},  {64, 7, 4097, 0, 0, 2},  {40, 24, 4096 + 4096 + 40, 1, 0, 0},
            {137, 24, 7168, 0, 0, 0}, {137, 24, 7168, 16, 0, 0}, {300, 24, 7680, 0, 0, 0}, {20, 24, 28672, 16, 0, 0},
            {13, 24, 28672, 0, 0, 0}, {300, 24, 2 * 6144 + 100, 5, 1, 2}, {273, 24, 13000, 16, 0, 0},
            {260, 24, 640, 16, 0, 1},  {290, 40, 9000, 3, 0, 0},  {257, 24, 20000, 200, 0, 0},
        };
        for (size_t i = 0; i < sizeof amx / sizeof amx[0]; ++i)
            check_shape(rng, amx[i], isa);
    }
    check_exact_b(rng, name);
    check_batch_invariance(rng, name);
    check_determinism(rng, name);
}

/* The generic and AVX2 kernels both keep 8 partial sums per output with the same lane
 * assignment (k mod 8 from the split's start), in chunks of different lengths (448 and 224):
 * their D and S are the same bits. */
static void check_same_bits_8_lanes(tu_rng *rng) {
    if (dg_get_isa() < DG_ISA_AVX2)
        return;
    const dg_isa best = dg_get_isa();
    const shape shapes[] = {{3, 24, 7168, 16, 0, 0}, {137, 24, 7168, 0, 0, 0}, {13, 24, 1000, 3, 1, 1},
                            {5, 40, 900, 0, 0, 0},   {2, 24, 225, 2, 0, 0}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; ++i) {
        bufs x;
        bufs_init(&x, rng, shapes[i]);
        float *d[2], *sq[2];
        for (int v = 0; v < 2; ++v) {
            d[v] = malloc(d_elems(&x) * 4), sq[v] = malloc(s_elems(&x) * 4);
            TU_CHECK_OK(dg_set_isa(v ? DG_ISA_AVX2 : DG_ISA_GENERIC));
            TU_CHECK_OK(run(&x, d[v], sq[v]));
        }
        TU_CHECK(memcmp(d[0], d[1], d_elems(&x) * 4) == 0 && memcmp(sq[0], sq[1], s_elems(&x) * 4) == 0,
                 "m=%d n=%d k=%d splits=%d: generic and avx2 give different bits", shapes[i].m, shapes[i].n,
                 shapes[i].k, shapes[i].splits);
        for (int v = 0; v < 2; ++v)
            free(d[v]), free(sq[v]);
        bufs_free(&x);
    }
    TU_CHECK_OK(dg_set_isa(best));
}

/* dg_use_reference() selects the reference: its d is the double sum rounded once. */
static void check_backend_switch(tu_rng *rng) {
    bufs x;
    bufs_init(&x, rng, (shape){3, 24, 900, 0, 0, 0});
    float *d = malloc(d_elems(&x) * 4), *s = malloc(s_elems(&x) * 4);
    TU_CHECK_OK(dg_set_backend(DG_BACKEND_REFERENCE));
    TU_CHECK_OK(run(&x, d, s));
    TU_CHECK_OK(dg_set_backend(DG_BACKEND_AUTO));
    int exact = 1;
    for (int i = 0; i < 3; ++i)
        for (int n = 0; n < 24; ++n) {
            double acc = 0;
            for (int j = 0; j < 900; ++j)
                acc += (double)x.af[i * 900 + j] * x.b[n * 900 + j];
            exact &= d[i * 24 + n] == (float)acc;
        }
    TU_CHECK(exact, "the reference backend rounds the exact sum once");
    free(d), free(s);
    bufs_free(&x);
}

int main(void) {
    tu_rng rng = {77};
    const dg_isa best = dg_get_isa();
    const dg_isa isas[4] = {DG_ISA_GENERIC, DG_ISA_AVX2, DG_ISA_AVX512, DG_ISA_AMX};
    for (int i = 0; i < 4; ++i) {
        if (isas[i] > best || dg_set_isa(isas[i]) != DG_OK) {
            printf("note: %s not available here, not tested\n", dg_isa_name(isas[i]));
            continue;
        }
        check_isa(&rng, isas[i]);
    }
    TU_CHECK_OK(dg_set_isa(best));
    check_same_bits_8_lanes(&rng);
    check_backend_switch(&rng);
    return tu_finish();
}
