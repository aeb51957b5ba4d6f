/*
 * test_formats.c - number formats (SPEC 1) and dg_cast.
 *
 * The float32 -> E4M3 and float32 -> BF16 conversions are checked over ALL 2^32 float32 bit
 * patterns against definitions written here independently of the library (nearest
 * representable value, ties to the even code, found by walking the sorted value table), split
 * over two threads (one per sign). The AVX-512 run kernel (when the CPU has it) is checked over
 * the same patterns; dg_cast is checked on both ISA paths for every E4M3 code, dense float32
 * ranges, tails and strided views.
 */
#include "test_util.h"

#include "core/internal.h"
#include "formats/convert.h"

#include <math.h>
#include <pthread.h>
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

/* ---- independent definitions -------------------------------------------------------------- */

/* E4M3 magnitude of code c in [0, 126] (0x7f is NaN) from the format's definition. */
static double g_e4m3_val[127], g_e4m3_mid[126];

static void init_e4m3_table(void) {
    for (int c = 0; c < 127; ++c) {
        const int e = c >> 3, m = c & 7;
        g_e4m3_val[c] = e == 0 ? m * ldexp(1.0, -9) : (1.0 + m / 8.0) * ldexp(1.0, e - 7);
    }
    for (int c = 0; c < 126; ++c)
        g_e4m3_mid[c] = (g_e4m3_val[c] + g_e4m3_val[c + 1]) / 2;
}

/* Walker over increasing magnitudes: the nearest finite code, ties to the even code. As
 * PyTorch 2.13 casts (tests/python checks it), everything beyond 448 including infinity
 * saturates to 448 (0x7e); NaN gives 0x7f. */
typedef struct e4m3_walk { int idx; } e4m3_walk;

static uint8_t e4m3_expect(e4m3_walk *w, uint32_t mag_bits) {
    if (mag_bits > 0x7f800000u)
        return 0x7f;
    const double x = u2f(mag_bits);
    while (w->idx < 126 && x > g_e4m3_mid[w->idx])
        ++w->idx;
    if (w->idx < 126 && x == g_e4m3_mid[w->idx])
        return (uint8_t)(w->idx % 2 == 0 ? w->idx : w->idx + 1);
    return (uint8_t)w->idx;
}

/* BF16 spacing for each float32 exponent field: 2^(e - 127 - 7), subnormals like e = 1. */
static double g_bf16_step[256];

static void init_bf16_table(void) {
    for (int e = 0; e < 256; ++e)
        g_bf16_step[e] = ldexp(1.0, (e == 0 ? 1 : e) - 127 - 7);
}

/* BF16: the two neighbours by truncation, the nearer one, ties to the even one; NaN quiet. */
static uint16_t bf16_expect(uint32_t u) {
    const uint32_t mag = u & 0x7fffffffu, sign = u & 0x80000000u;
    if (mag > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    const uint32_t lo = mag & 0xffff0000u;
    const double step = g_bf16_step[lo >> 23];
    const double x = u2f(mag), lo_v = u2f(lo), hi_v = lo_v + step;
    uint32_t pick;
    if (x - lo_v < hi_v - x)
        pick = lo;
    else if (x - lo_v > hi_v - x)
        pick = lo + 0x10000u;
    else
        pick = (lo & 0x10000u) ? lo + 0x10000u : lo;
    return (uint16_t)((sign | pick) >> 16);
}

/* ---- exhaustive sweep: one thread per sign ------------------------------------------------- */

typedef struct sweep_job {
    uint32_t sign;
    dg_isa kernel_isa; /* the run kernels swept beside the scalar functions (GENERIC: none) */
    long long bad_e4m3, bad_bf16, bad_kernel, bad_kernel_bf16;
    uint32_t first_bad;
} sweep_job;

#define SWEEP_BLOCK 4096

static void *sweep(void *arg) {
    sweep_job *job = arg;
    static _Thread_local float xs[SWEEP_BLOCK];
    static _Thread_local uint8_t ks[SWEEP_BLOCK], es[SWEEP_BLOCK];
    static _Thread_local uint16_t hs[SWEEP_BLOCK], hw[SWEEP_BLOCK];
    e4m3_walk w = {0};
    const dg_convert_kernels *k = dg_convert_kernels_for(job->kernel_isa);
    for (uint64_t base = 0; base < 0x80000000ull; base += SWEEP_BLOCK) {
        for (int i = 0; i < SWEEP_BLOCK; ++i) {
            const uint32_t mag = (uint32_t)base + (uint32_t)i;
            const uint32_t u = job->sign | mag;
            xs[i] = u2f(u);
            es[i] = (uint8_t)(e4m3_expect(&w, mag) | (job->sign >> 24));
            if (dg_float_to_e4m3(xs[i]) != es[i] && job->bad_e4m3++ == 0)
                job->first_bad = u;
            hw[i] = bf16_expect(u);
            if (dg_float_to_bf16(xs[i]) != hw[i])
                job->bad_bf16++;
        }
        if (job->kernel_isa != DG_ISA_GENERIC) {
            k->f32_to_e4m3(xs, ks, SWEEP_BLOCK - (base & 7)); /* odd lengths: the tails too */
            if (memcmp(ks, es, SWEEP_BLOCK - (base & 7)) != 0)
                job->bad_kernel++;
            k->f32_to_bf16(xs, hs, SWEEP_BLOCK);
            if (memcmp(hs, hw, sizeof hs) != 0)
                job->bad_kernel_bf16++;
        }
    }
    return NULL;
}

static void test_exhaustive_e4m3(void) {
    /* The best run kernels this CPU runs (AVX-512 or AVX2), on every float32 bit pattern. */
    const dg_isa best = dg_get_isa();
    const dg_isa kisa = (best >= DG_ISA_AVX512 && DG_HAVE_AVX512_KERNELS) ? DG_ISA_AVX512
                        : (best >= DG_ISA_AVX2 && DG_HAVE_AVX2_KERNELS) ? DG_ISA_AVX2
                                                                        : DG_ISA_GENERIC;
    sweep_job jobs[2] = {{.sign = 0, .kernel_isa = kisa}, {.sign = 0x80000000u, .kernel_isa = kisa}};
    pthread_t th[2];
    for (int t = 0; t < 2; ++t)
        pthread_create(&th[t], NULL, sweep, &jobs[t]);
    for (int t = 0; t < 2; ++t)
        pthread_join(th[t], NULL);
    for (int t = 0; t < 2; ++t) {
        TU_CHECK(jobs[t].bad_e4m3 == 0, "dg_float_to_e4m3: %lld mismatches (sign %d), first 0x%08x", jobs[t].bad_e4m3,
                 t, jobs[t].first_bad);
        TU_CHECK(jobs[t].bad_bf16 == 0, "dg_float_to_bf16: %lld mismatches (sign %d)", jobs[t].bad_bf16, t);
        TU_CHECK(jobs[t].bad_kernel == 0, "%s f32->e4m3 kernel: %lld bad blocks (sign %d)", dg_isa_name(kisa),
                 jobs[t].bad_kernel, t);
        TU_CHECK(jobs[t].bad_kernel_bf16 == 0, "%s f32->bf16 kernel: %lld bad blocks (sign %d)", dg_isa_name(kisa),
                 jobs[t].bad_kernel_bf16, t);
    }
    printf("exhaustive float32 -> e4m3, bf16 (scalar%s%s): done\n", kisa != DG_ISA_GENERIC ? " and " : "",
           kisa != DG_ISA_GENERIC ? dg_isa_name(kisa) : "");
}

/* ---- decoding and the small formats ------------------------------------------------------ */

static void test_e4m3_codes(void) {
    int bad = 0, bad_rt = 0;
    for (int c = 0; c < 256; ++c) {
        const float v = dg_e4m3_to_float((uint8_t)c);
        const int mag = c & 0x7f;
        if (mag == 0x7f) {
            bad += !(isnan(v) && !!signbit(v) == (c >> 7));
            continue;
        }
        const double want = (c & 0x80) ? -g_e4m3_val[mag] : g_e4m3_val[mag];
        bad += (double)v != want || !!signbit(v) != (c >> 7);
        bad_rt += dg_float_to_e4m3(v) != c; /* every finite code survives a round trip */
    }
    TU_CHECK(bad == 0, "dg_e4m3_to_float: %d codes wrong", bad);
    TU_CHECK(bad_rt == 0, "e4m3 round trip: %d codes wrong", bad_rt);
    TU_CHECK(dg_float_to_e4m3(448.0f) == 0x7e && dg_float_to_e4m3(-1e30f) == 0xfe, "saturation");
    TU_CHECK(dg_float_to_e4m3(INFINITY) == 0x7e && dg_float_to_e4m3(-INFINITY) == 0xfe, "infinity saturates");
    TU_CHECK(dg_float_to_e4m3(NAN) == 0x7f && dg_float_to_e4m3(-NAN) == 0xff, "NaN keeps its sign");
    TU_CHECK(dg_float_to_e4m3(0x1p-10f) == 0x00 && dg_float_to_e4m3(0x3p-10f) == 0x02, "subnormal ties to even");
    TU_CHECK(dg_float_to_e4m3(-0.0f) == 0x80, "-0");
}

static void test_bf16_spots(void) {
    TU_CHECK(dg_float_to_bf16(u2f(0x3f808000u)) == 0x3f80, "tie to even (down)");
    TU_CHECK(dg_float_to_bf16(u2f(0x3f818000u)) == 0x3f82, "tie to even (up)");
    TU_CHECK(dg_float_to_bf16(u2f(0x3f808001u)) == 0x3f81, "above the tie");
    TU_CHECK(dg_float_to_bf16(u2f(0x7f7fffffu)) == 0x7f80, "overflow rounds to infinity");
    TU_CHECK(dg_float_to_bf16(u2f(0xff800001u)) == 0xffc0, "signalling NaN becomes quiet, sign kept");
    TU_CHECK(dg_float_to_bf16(u2f(0x00008000u)) == 0x0000 && dg_float_to_bf16(u2f(0x00018000u)) == 0x0002,
             "subnormal ties");
    TU_CHECK(f2u(dg_bf16_to_float(0xc049)) == 0xc0490000u, "bf16 -> float is the upper half");
}

/* binary16 by definition: the value of code h in double. */
static double f16_value(uint16_t h) {
    const int e = (h >> 10) & 31, f = h & 1023;
    const double v = e ? ldexp(1024 + f, e - 25) : ldexp(f, -24);
    return (h & 0x8000) ? -v : v;
}

/* Every half: its float is its value (infinities, NaNs kept), and converting back gives the
 * code again. Every float in a sweep (all exponents, dense mantissas): the nearest half,
 * ties to the even code, 65520 and up to infinity. */
static void test_f16(void) {
    int bad_value = 0, bad_back = 0;
    for (uint32_t h = 0; h < 65536; ++h) {
        const float f = dg_f16_to_float((uint16_t)h);
        const int e = (h >> 10) & 31;
        if (e == 31) {
            bad_value += (h & 1023) ? !isnan(f) : !(isinf(f) && (f < 0) == !!(h & 0x8000));
            bad_back += (h & 1023) ? (dg_float_to_f16(f) & 0x7e00) != 0x7e00 : dg_float_to_f16(f) != h;
            continue;
        }
        bad_value += (double)f != f16_value((uint16_t)h) || (signbit(f) != 0) != !!(h & 0x8000);
        bad_back += dg_float_to_f16(f) != h;
    }
    TU_CHECK(bad_value == 0, "f16 -> float: %d codes give another value", bad_value);
    TU_CHECK(bad_back == 0, "f16 -> float -> f16: %d codes change", bad_back);
    int bad_round = 0;
    for (uint32_t u = 0x33000000u; u < 0x47800000u; u += 0x135u) { /* 2^-25 .. 65536 */
        const float x = u2f(u);
        const uint16_t got = dg_float_to_f16(x);
        int ok = dg_float_to_f16(-x) == (got | 0x8000);
        if ((double)x >= 65520.0) {
            ok &= got == 0x7c00;
        } else if (got >= 0x7c00) {
            ok = 0;
        } else { /* codes are monotonic in value: nearest means no closer neighbour, ties even */
            const double d = fabs(f16_value(got) - (double)x);
            for (int n = -1; n <= 1; n += 2) {
                if ((got == 0 && n < 0) || (got == 0x7bff && n > 0))
                    continue;
                const double dn = fabs(f16_value((uint16_t)(got + n)) - (double)x);
                ok &= d < dn || (d == dn && !(got & 1));
            }
        }
        bad_round += !ok;
    }
    TU_CHECK(bad_round == 0, "float -> f16: %d values not rounded to the nearest half (ties to even)", bad_round);
    TU_CHECK(dg_float_to_f16(65504.0f) == 0x7bff && dg_float_to_f16(65519.99f) == 0x7bff &&
             dg_float_to_f16(65520.0f) == 0x7c00 && dg_float_to_f16(INFINITY) == 0x7c00,
             "f16 overflow at 65520");
    TU_CHECK(dg_float_to_f16(0x1p-25f) == 0 && dg_float_to_f16(0x1.000002p-25f) == 1 &&
             dg_float_to_f16(0x1.8p-24f) == 2, "f16 subnormal ties");
    TU_CHECK((dg_float_to_f16(-NAN) & 0xfe00) == 0xfe00, "f16 NaN stays NaN with its sign");
}

/* E2M1 by definition: nearest of the 8 magnitudes, ties to the SMALLER one (DeepGEMM's strict
 * '>'), saturating at 6; sign only on a non-zero magnitude; NaN -> +0. */
static uint8_t e2m1_expect(float x) {
    static const double kMag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    if (isnan(x))
        return 0;
    const double a = fabs((double)x);
    int best = 0;
    for (int c = 1; c < 8; ++c)
        if (fabs(a - kMag[c]) < fabs(a - kMag[best]))
            best = c;
    return (uint8_t)(best | ((x < 0 && best) ? 8 : 0));
}

static void test_e2m1(void) {
    static const float kMid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    for (int i = 0; i < 7; ++i) {
        TU_CHECK(dg_float_to_e2m1(kMid[i]) == i, "midpoint %g goes down", kMid[i]);
        TU_CHECK(dg_float_to_e2m1(nextafterf(kMid[i], 10)) == i + 1, "just above %g goes up", kMid[i]);
        TU_CHECK(dg_float_to_e2m1(-kMid[i]) == (i ? (8 | i) : 0), "negative midpoint %g", kMid[i]);
    }
    TU_CHECK(dg_float_to_e2m1(-0.1f) == 0 && dg_float_to_e2m1(-0.0f) == 0, "zero magnitude is positive");
    TU_CHECK(dg_float_to_e2m1(NAN) == 0 && dg_float_to_e2m1(INFINITY) == 7 && dg_float_to_e2m1(-INFINITY) == 15,
             "NaN and infinities");
    static const float kVal[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    for (int c = 0; c < 16; ++c) {
        const float v = dg_e2m1_to_float((uint8_t)c);
        TU_CHECK(v == ((c & 8) ? -kVal[c & 7] : kVal[c & 7]) && !!signbit(v) == !!(c & 8), "e2m1 code %d", c);
    }
    /* Every 61st float32 pattern up to |x| = 8 (all residues of the low bits), both signs. */
    long long bad = 0;
    for (uint32_t u = 0; u <= 0x41000000u; u += 61)
        bad += dg_float_to_e2m1(u2f(u)) != e2m1_expect(u2f(u)) ||
               dg_float_to_e2m1(u2f(u | 0x80000000u)) != e2m1_expect(u2f(u | 0x80000000u));
    TU_CHECK(bad == 0, "e2m1 dense sweep: %lld mismatches", bad);
}

/* Smallest power of two >= |x| by definition (frexp), exponent field clamped to [1, 254]. */
static uint32_t ue8m0_expect_bits(uint32_t u) {
    const uint32_t mag = u & 0x7fffffffu;
    if (mag >= 0x7f800000u) /* DeepGEMM's bit formula: exponent 255 (+1) clamps to 254 */
        return 254u << 23;
    int e;
    const double m = frexp((double)u2f(mag), &e); /* mag = m * 2^e, m in [0.5, 1) */
    int field = mag == 0 ? 0 : (m == 0.5 ? e - 1 : e) + 127;
    field = field < 1 ? 1 : (field > 254 ? 254 : field);
    return (uint32_t)field << 23;
}

static void test_ue8m0(void) {
    long long bad = 0;
    for (uint64_t u = 0; u <= 0xffffffffull; u += 97) { /* a dense stride over all patterns */
        const uint32_t want = ue8m0_expect_bits((uint32_t)u);
        const float got = dg_ceil_to_ue8m0(u2f((uint32_t)u));
        bad += f2u(got) != want || dg_float_to_ue8m0(u2f((uint32_t)u)) != (want >> 23);
    }
    for (int e = 1; e < 255; ++e) /* powers of two and their neighbours */
        for (int d = -1; d <= 1; ++d) {
            const uint32_t u = ((uint32_t)e << 23) + (uint32_t)d;
            bad += f2u(dg_ceil_to_ue8m0(u2f(u))) != ue8m0_expect_bits(u);
        }
    TU_CHECK(bad == 0, "ceil_to_ue8m0: %lld mismatches", bad);
    TU_CHECK(dg_ceil_to_ue8m0(0.0f) == 0x1p-126f && dg_ceil_to_ue8m0(1e-45f) == 0x1p-126f, "clamped below");
    TU_CHECK(dg_ceil_to_ue8m0(3e38f) == 0x1p127f && dg_ceil_to_ue8m0(NAN) == 0x1p127f, "clamped above");
    TU_CHECK(dg_ceil_to_ue8m0(-3.0f) == 4.0f && dg_ceil_to_ue8m0(4.0f) == 4.0f, "abs and exact powers");
    for (int e = 1; e < 255; ++e)
        bad += dg_ue8m0_to_float((uint8_t)e) != (float)ldexp(1.0, e - 127);
    TU_CHECK(bad == 0, "ue8m0 decode");
    TU_CHECK(dg_ue8m0_to_float(0) == 0x1p-127f && isinf(dg_ue8m0_to_float(255)), "ue8m0 decode ends");
}

/* ---- dg_cast ------------------------------------------------------------------------------ */

/* Scalar expectation of one element of any supported dtype pair (bits). */
static uint32_t cast_expect(dg_dtype st, const void *sp, dg_dtype dt) {
    float v;
    if (st == dt) {
        uint32_t bits = 0;
        memcpy(&bits, sp, dg_dtype_size(st));
        return bits;
    }
    if (st == DG_FLOAT32)
        memcpy(&v, sp, 4);
    else if (st == DG_BFLOAT16)
        v = dg_bf16_to_float(*(const uint16_t *)sp);
    else
        v = dg_e4m3_to_float(*(const uint8_t *)sp);
    if (dt == DG_FLOAT32)
        return f2u(v);
    return dt == DG_BFLOAT16 ? dg_float_to_bf16(v) : dg_float_to_e4m3(v);
}

/* dg_cast over a pair of (possibly strided) tensors, compared element by element. */
static long long cast_and_compare(const dg_tensor *src, const dg_tensor *dst) {
    if (dg_cast(src, dst) != DG_OK)
        return -1;
    long long bad = 0;
    const int64_t n = dg_tensor_numel(src);
    int64_t idx[DG_MAX_DIMS] = {0};
    for (int64_t e = 0; e < n; ++e, dg_index_next(idx, src->shape, src->ndim)) {
        uint32_t got = 0;
        memcpy(&got, dg_elem_ptr(dst, idx), dg_dtype_size(dst->dtype));
        bad += got != cast_expect(src->dtype, dg_elem_ptr(src, idx), dst->dtype);
    }
    return bad;
}

/* Contiguous runs of every length 0..70 at offsets 0..3 (kernel bodies and masked tails). */
static void test_cast_runs(const char *isa) {
    enum { N = 80 };
    uint8_t codes[N + 4];
    float fl[N + 4];
    tu_rng r = {42};
    for (int i = 0; i < N + 4; ++i) {
        codes[i] = (uint8_t)(i * 37 + 11);
        fl[i] = (float)(tu_normal(&r) * 300.0);
    }
    static const dg_dtype kTypes[3] = {DG_FLOAT32, DG_BFLOAT16, DG_FLOAT8_E4M3};
    long long bad = 0;
    for (int si = 0; si < 3; ++si)
        for (int di = 0; di < 3; ++di)
            for (int len = 0; len <= 70; ++len)
                for (int off = 0; off < 4; ++off) {
                    uint32_t srcbuf[N + 4], dstbuf[N + 8];
                    const dg_dtype st = kTypes[si], dt = kTypes[di];
                    for (int i = 0; i < N + 4; ++i) { /* the same values in each source dtype */
                        if (st == DG_FLOAT32)
                            ((float *)srcbuf)[i] = fl[i];
                        else if (st == DG_BFLOAT16)
                            ((uint16_t *)srcbuf)[i] = dg_float_to_bf16(fl[i]);
                        else
                            ((uint8_t *)srcbuf)[i] = codes[i];
                    }
                    memset(dstbuf, 0xa5, sizeof dstbuf);
                    const size_t dz = dg_dtype_size(dt);
                    dg_tensor s = dg_tensor_1d((char *)srcbuf + off * dg_dtype_size(st), st, len);
                    dg_tensor d = dg_tensor_1d((char *)dstbuf + off * dz, dt, len);
                    bad += cast_and_compare(&s, &d) != 0;
                    /* nothing written past the end */
                    const unsigned char *after = (const unsigned char *)dstbuf + (off + len) * dz;
                    for (size_t b = 0; b < 8; ++b)
                        bad += after[b] != 0xa5;
                }
    TU_CHECK(bad == 0, "[%s] dg_cast runs: %lld failures", isa, bad);

    /* All 256 codes to float32 and bf16 in one run. */
    uint8_t all[256];
    float f32[256];
    uint16_t b16[256];
    for (int c = 0; c < 256; ++c)
        all[c] = (uint8_t)c;
    dg_tensor s = dg_tensor_1d(all, DG_FLOAT8_E4M3, 256), df = dg_tensor_1d(f32, DG_FLOAT32, 256),
              db = dg_tensor_1d(b16, DG_BFLOAT16, 256);
    TU_CHECK(cast_and_compare(&s, &df) == 0 && cast_and_compare(&s, &db) == 0, "[%s] all e4m3 codes", isa);
}

/* Every float32 pattern of a range (stride `step`) through dg_cast to e4m3 and bf16. */
static void test_cast_range(const char *isa, uint32_t lo, uint32_t hi, uint32_t step) {
    enum { B = 1 << 16 };
    float *x = malloc(B * sizeof(float));
    uint8_t *e = malloc(B);
    uint16_t *h = malloc(B * 2);
    long long bad = 0;
    uint64_t u = lo;
    while (u <= hi) {
        int n = 0;
        for (; n < B && u <= hi; ++n, u += step)
            x[n] = u2f((uint32_t)u);
        dg_tensor s = dg_tensor_1d(x, DG_FLOAT32, n), de = dg_tensor_1d(e, DG_FLOAT8_E4M3, n),
                  dh = dg_tensor_1d(h, DG_BFLOAT16, n);
        if (dg_cast(&s, &de) != DG_OK || dg_cast(&s, &dh) != DG_OK) {
            ++bad;
            break;
        }
        for (int i = 0; i < n; ++i)
            bad += e[i] != dg_float_to_e4m3(x[i]) || h[i] != dg_float_to_bf16(x[i]);
    }
    TU_CHECK(bad == 0, "[%s] dg_cast float32 range 0x%08x..0x%08x step %u: %lld mismatches", isa, lo, hi, step, bad);
    free(x);
    free(e);
    free(h);
}

static void test_cast_strided(const char *isa) {
    /* A [4, 6, 5] float32 tensor viewed transposed, cast into differently laid out outputs. */
    float buf[120];
    tu_rng r = {7};
    for (int i = 0; i < 120; ++i)
        buf[i] = (float)(tu_normal(&r) * 100.0);
    buf[3] = NAN;
    buf[4] = -INFINITY;
    buf[5] = 1000.0f;
    dg_tensor x = dg_tensor_3d(buf, DG_FLOAT32, 4, 6, 5);
    dg_tensor xt = dg_tensor_transpose(x, 0, 2); /* [5, 6, 4] */
    uint32_t out[2 * 120];
    static const dg_dtype kTypes[3] = {DG_FLOAT32, DG_BFLOAT16, DG_FLOAT8_E4M3};
    long long bad = 0;
    for (int di = 0; di < 3; ++di) {
        dg_tensor d = dg_tensor_3d(out, kTypes[di], 5, 6, 4);
        bad += cast_and_compare(&xt, &d) != 0;
        dg_tensor dt = dg_tensor_transpose(dg_tensor_3d(out, kTypes[di], 4, 6, 5), 0, 2);
        dg_tensor dc = dg_tensor_3d(out, kTypes[di], 4, 6, 5);
        bad += cast_and_compare(&x, &dc) != 0;
        bad += cast_and_compare(&xt, &dt) != 0; /* both transposed: merged into one run */
        dg_tensor padded = dg_tensor_3d(out, kTypes[di], 5, 6, 4);
        padded.strides[0] = 40; /* rows padded to 40 elements (the buffer holds 200 and more) */
        padded.strides[1] = 6;
        padded.strides[2] = 1;
        bad += cast_and_compare(&xt, &padded) != 0;
    }
    /* Through BF16 and E4M3 sources as well. */
    uint16_t hb[120];
    uint8_t eb[120];
    dg_tensor h = dg_tensor_3d(hb, DG_BFLOAT16, 4, 6, 5), e = dg_tensor_3d(eb, DG_FLOAT8_E4M3, 4, 6, 5);
    TU_CHECK_OK(dg_cast(&x, &h));
    TU_CHECK_OK(dg_cast(&x, &e));
    for (int di = 0; di < 3; ++di) {
        dg_tensor d = dg_tensor_3d(out, kTypes[di], 5, 6, 4);
        dg_tensor ht = dg_tensor_transpose(h, 0, 2), et = dg_tensor_transpose(e, 0, 2);
        bad += cast_and_compare(&ht, &d) != 0;
        bad += cast_and_compare(&et, &d) != 0;
    }
    TU_CHECK(bad == 0, "[%s] strided dg_cast: %d failures", isa, (int)bad);
    /* An in-place cast of a tensor onto itself (same dtype) is allowed and changes nothing. */
    float before[120];
    memcpy(before, buf, sizeof before);
    TU_CHECK_OK(dg_cast(&x, &x));
    TU_CHECK(memcmp(before, buf, sizeof before) == 0, "[%s] self cast", isa);
    /* 0-d and empty tensors. */
    float one = 3.0f;
    uint8_t one8 = 0;
    dg_tensor s0 = dg_tensor_make(&one, DG_FLOAT32, 0, NULL), d0 = dg_tensor_make(&one8, DG_FLOAT8_E4M3, 0, NULL);
    TU_CHECK(dg_cast(&s0, &d0) == DG_OK && one8 == dg_float_to_e4m3(3.0f), "[%s] 0-d cast", isa);
    dg_tensor se = dg_tensor_2d(NULL, DG_FLOAT32, 0, 3), de = dg_tensor_2d(NULL, DG_BFLOAT16, 0, 3);
    TU_CHECK_OK(dg_cast(&se, &de));
}

static void run_cast_tests(dg_isa isa) {
    if (dg_set_isa(isa) != DG_OK)
        return;
    const char *name = dg_isa_name(isa);
    const dg_convert_kernels *k = dg_convert_kernels_for(dg_get_isa());
    TU_CHECK(isa >= DG_ISA_AVX2 || k->f32_to_e4m3 == dg_f32_to_e4m3_generic, "[%s] generic kernels chosen", name);
#if DG_HAVE_AVX2_KERNELS
    TU_CHECK(isa != DG_ISA_AVX2 || k->f32_to_e4m3 == dg_f32_to_e4m3_avx2, "[%s] AVX2 kernels chosen", name);
#endif
    test_cast_runs(name);
    test_cast_strided(name);
    /* The ranges that matter: E4M3 rounds everything below 2^-10 to 0 and saturates above 2^9;
     * patterns in [2^-11, 2^9] with a stride coprime to 2 (the exhaustive sweep above already
     * covered the best run kernels on every pattern), plus a stride over all. */
    const uint32_t step = isa >= DG_ISA_AVX2 ? 3 : 7;
    test_cast_range(name, 0x3a000000u, 0x44000000u, step);
    test_cast_range(name, 0xba000000u, 0xc4000000u, step * 3);
    test_cast_range(name, 0, 0xffffffffu, 4099);
    test_cast_range(name, 0x7f7ffff0u, 0x7f800010u, 1);  /* FLT_MAX, infinity, NaN */
    test_cast_range(name, 0xfffffff0u, 0xffffffffu, 1);  /* negative NaNs */
    test_cast_range(name, 0, 0x00000100u, 1);            /* float32 subnormals */
}

static void test_cast_errors(void) {
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint8_t e[6] = {9, 9, 9, 9, 9, 9};
    int32_t iv[6] = {0};
    dg_tensor x = dg_tensor_2d(a, DG_FLOAT32, 2, 3), y = dg_tensor_2d(e, DG_FLOAT8_E4M3, 2, 3);
    void *snap = tu_snapshot(&y);
    TU_CHECK_STATUS(dg_cast(NULL, &y), DG_ERR_NULL_POINTER);
    TU_CHECK(strstr(dg_last_error(), "dg_cast") && strstr(dg_last_error(), "'src'"), "names src: %s", dg_last_error());
    TU_CHECK_STATUS(dg_cast(&x, NULL), DG_ERR_NULL_POINTER);
    TU_CHECK(strstr(dg_last_error(), "'dst'") != NULL, "names dst: %s", dg_last_error());
    dg_tensor bad = dg_tensor_2d(iv, DG_INT32, 2, 3);
    TU_CHECK_STATUS(dg_cast(&bad, &y), DG_ERR_DTYPE);
    TU_CHECK(strstr(dg_last_error(), "'src'") != NULL, "names src: %s", dg_last_error());
    dg_tensor yfp4 = dg_tensor_2d(e, DG_FP4_E2M1X2, 2, 3);
    TU_CHECK_STATUS(dg_cast(&x, &yfp4), DG_ERR_DTYPE);
    dg_tensor y32 = dg_tensor_2d(e, DG_FLOAT8_E4M3, 3, 2);
    TU_CHECK_STATUS(dg_cast(&x, &y32), DG_ERR_SHAPE);
    TU_CHECK(strstr(dg_last_error(), "'dst'") != NULL, "names dst: %s", dg_last_error());
    dg_tensor y1 = dg_tensor_1d(e, DG_FLOAT8_E4M3, 6);
    TU_CHECK_STATUS(dg_cast(&x, &y1), DG_ERR_SHAPE);
    dg_tensor yz = y;
    yz.strides[0] = 0; /* two rows onto the same bytes */
    TU_CHECK_STATUS(dg_cast(&x, &yz), DG_ERR_LAYOUT);
    dg_tensor ynull = dg_tensor_2d(NULL, DG_FLOAT8_E4M3, 2, 3);
    TU_CHECK_STATUS(dg_cast(&x, &ynull), DG_ERR_NULL_POINTER);
    TU_CHECK(tu_unchanged(&y, snap), "dst untouched by failed calls");
    /* Overlap: a BF16 view over the float32 input's own bytes. */
    float before[6];
    memcpy(before, a, sizeof a);
    dg_tensor alias = dg_tensor_2d(a, DG_BFLOAT16, 2, 3);
    TU_CHECK_STATUS(dg_cast(&x, &alias), DG_ERR_LAYOUT);
    TU_CHECK(memcmp(before, a, sizeof a) == 0, "input untouched");
    free(snap);
}

int main(void) {
    init_e4m3_table();
    init_bf16_table();
    test_e4m3_codes();
    test_bf16_spots();
    test_f16();
    test_e2m1();
    test_ue8m0();
    test_exhaustive_e4m3();
    const dg_isa isa0 = dg_get_isa();
    run_cast_tests(DG_ISA_GENERIC);
    run_cast_tests(DG_ISA_AVX2);
    run_cast_tests(DG_ISA_AVX512);
    TU_CHECK_OK(dg_set_isa(isa0));
    test_cast_errors();
    return tu_finish();
}
