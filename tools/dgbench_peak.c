/*
 * dgbench_peak.c - this machine's limits, measured in the same run as the kernels, on all
 * kernel threads at once (pthreads):
 *   BF16   VDPBF16PS on zmm registers: 16 lanes x 2 products x 2 = 64 flops per instruction
 *   FP32   FMA on zmm (32 flops) registers where the CPU has AVX-512, and on ymm (16 flops)
 *          registers wherever it has AVX2 + FMA (the limit of the avx2 level, see compute_peak)
 *   INT8   VPDPBUSD on zmm registers: 64 products x 2 = 128 ops per instruction
 *   DRAM   a streaming read over a buffer several times the last-level cache
 *   AMX    (where the CPU, compiler and kernel allow it) TDPBF16PS / TDPBSSD on tiles, four
 *          independent accumulator tiles; BF16 and INT8 cases are rated against these when
 *          the library runs at isa amx (its kernels then use tiles; see compute_peak)
 * The compute loops keep 12 independent accumulators in registers, enough to cover the
 * latency x throughput of these instructions on current x86 cores, and touch no memory.
 * Each accumulator starts from a different value: identical ones would let the compiler
 * merge them into a single dependency chain (GCC does).
 * Each function carries its own target attribute and runs only when the CPU reports the
 * feature, so the tool itself runs on any x86-64.
 *
 * Which limit is higher depends on the core, and both orders are real (the loops above were
 * checked: 12 register-only chains, no loads, flop counts per instruction as stated):
 *   AMD Zen 4: one zmm FMA per cycle (two 256-bit halves) and one VDPBF16PS per cycle, so
 *              BF16 ~ 2 x FP32 (64 vs 32 flops per cycle);
 *   Intel Sapphire Rapids class (two 512-bit FMA ports; VDPBF16PS about one per two cycles):
 *              FP32 ~ 2 x BF16. Measured on such a 2-core VM (CPUID GenuineIntel family 6,
 *              AMX and AVX512-FP16 present): per core BF16 ~114, FP32 ~229 GFLOPS.
 * BF16 products are exact in FP32, so a BF16 GEMM may use either; at isa avx512_bf16 dgbench.c
 * rates BF16 cases against the larger of the two (compute_peak), and at a lower level against
 * the FMA rate of that level's registers.
 */
#include "dgbench.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#define BENCH_X86 1
#include <cpuid.h>
#include <immintrin.h>
#else
#define BENCH_X86 0
#endif

/* AMX tile intrinsics inside target("amx-...") functions: GCC 11+, Clang 12+; the
 * permission request below is Linux-only and x86-64 only. */
#if BENCH_X86 && defined(__x86_64__) && defined(__linux__) &&                                  \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11))
#define BENCH_AMX 1
#include <sys/syscall.h>
#else
#define BENCH_AMX 0
#endif

/* ---- running one function on all threads ---- */

typedef struct par_job {
    void (*fn)(int tid, int nthreads, void *arg);
    void *arg;
    int tid, nthreads;
    pthread_barrier_t *start;
    double t0, t1; /* when this thread started and finished fn */
} par_job;

static void *par_main(void *p) {
    par_job *j = p;
    pthread_barrier_wait(j->start);
    j->t0 = bench_now();
    j->fn(j->tid, j->nthreads, j->arg);
    j->t1 = bench_now();
    return NULL;
}

/* Wall seconds from the first thread's start to the last one's end. The workers read the
 * clock themselves: on a loaded machine the releasing thread may run only after they have
 * finished, and its own clock would then see almost no time (a fluke of 262,556 "GFLOPS"
 * on a shared 2-core Zen 3 before this). */
static double run_parallel(int nthreads, void (*fn)(int, int, void *), void *arg) {
    pthread_t th[nthreads];
    par_job jobs[nthreads];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)nthreads + 1);
    int started = 0;
    for (int t = 0; t < nthreads; ++t) {
        jobs[t] = (par_job){fn, arg, t, nthreads, &start, 0, 0};
        if (pthread_create(&th[t], NULL, par_main, &jobs[t]) != 0)
            break;
        ++started;
    }
    if (started < nthreads) { /* cannot happen in practice; run the rest on this thread */
        for (int t = started; t < nthreads; ++t)
            fn(t, nthreads, arg);
        nthreads = started;
    }
    const double t_release = bench_now();
    pthread_barrier_wait(&start);
    for (int t = 0; t < started; ++t)
        pthread_join(th[t], NULL);
    const double t_end = bench_now();
    pthread_barrier_destroy(&start);
    if (started == 0)
        return t_end - t_release;
    double t0 = jobs[0].t0, t1 = jobs[0].t1;
    for (int t = 1; t < started; ++t) {
        t0 = jobs[t].t0 < t0 ? jobs[t].t0 : t0;
        t1 = jobs[t].t1 > t1 ? jobs[t].t1 : t1;
    }
    return t1 - t0;
}

/* ---- register-resident compute loops ---- */

typedef struct loop_arg {
    double (*loop)(long iters); /* returns a value depending on every result, so nothing is dead */
    long iters;
    volatile double sink;
} loop_arg;

static void loop_thread(int tid, int nthreads, void *p) {
    loop_arg *a = p;
    const double v = a->loop(a->iters);
    if (v == 12345.678) /* keeps the result alive without a shared write in the hot path */
        a->sink = v;
}

#if BENCH_X86
#define ACC12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

__attribute__((target("avx512f,avx512bf16"))) static double loop_bf16(long iters) {
    /* Small values so the sums stay finite and normal for any iteration count we use. */
    const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(1e-3f));
    const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(1e-3f));
#define DECL(i) __m512 acc##i = _mm512_set1_ps((float)i);
#define STEP(i) acc##i = _mm512_dpbf16_ps(acc##i, a, b);
#define SUM(i) s = _mm512_add_ps(s, acc##i);
    ACC12(DECL)
    for (long it = 0; it < iters; ++it) {
        ACC12(STEP)
    }
    __m512 s = _mm512_setzero_ps();
    ACC12(SUM)
    return _mm512_reduce_add_ps(s);
#undef DECL
#undef STEP
#undef SUM
}

__attribute__((target("avx512f"))) static double loop_fp32_avx512(long iters) {
    /* acc = acc * m + c converges to c / (1 - m): no overflow, no subnormals. */
    const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-3f);
#define DECL(i) __m512 acc##i = _mm512_set1_ps((float)i);
#define STEP(i) acc##i = _mm512_fmadd_ps(acc##i, m, c);
#define SUM(i) s = _mm512_add_ps(s, acc##i);
    ACC12(DECL)
    for (long it = 0; it < iters; ++it) {
        ACC12(STEP)
    }
    __m512 s = _mm512_setzero_ps();
    ACC12(SUM)
    return _mm512_reduce_add_ps(s);
#undef DECL
#undef STEP
#undef SUM
}

__attribute__((target("avx2,fma"))) static double loop_fp32_avx2(long iters) {
    const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-3f);
#define DECL(i) __m256 acc##i = _mm256_set1_ps((float)i);
#define STEP(i) acc##i = _mm256_fmadd_ps(acc##i, m, c);
#define SUM(i) s = _mm256_add_ps(s, acc##i);
    ACC12(DECL)
    for (long it = 0; it < iters; ++it) {
        ACC12(STEP)
    }
    __m256 s = _mm256_setzero_ps();
    ACC12(SUM)
    float out[8];
    _mm256_storeu_ps(out, s);
    return (double)out[0] + out[7];
#undef DECL
#undef STEP
#undef SUM
}

__attribute__((target("avx512f,avx512vnni"))) static double loop_int8(long iters) {
    const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
#define DECL(i) __m512i acc##i = _mm512_set1_epi32(i);
#define STEP(i) acc##i = _mm512_dpbusd_epi32(acc##i, a, b);
#define SUM(i) s = _mm512_add_epi32(s, acc##i);
    ACC12(DECL)
    for (long it = 0; it < iters; ++it) {
        ACC12(STEP)
    }
    __m512i s = _mm512_setzero_si512();
    ACC12(SUM)
    return (double)_mm512_reduce_add_epi32(s);
#undef DECL
#undef STEP
#undef SUM
}
#endif /* BENCH_X86 */

#if BENCH_AMX
/* AMX: 8 tile registers of up to 16 rows x 64 bytes. Tiles 0-3 accumulate (fp32 / int32,
 * 16 x 16), 4-5 are A (16 rows x 32 bf16 or 64 int8), 6-7 are B (16 rows of 16 column pairs
 * or quads), giving a 2 x 2 block: four independent chains, no loads in the loop.
 *   TDPBF16PS: C[16x16 fp32] += A[16x32 bf16] B[32x16 bf16]  = 2*16*16*32 = 16384 flops
 *   TDPBSSD:   C[16x16 int32] += A[16x64 s8]  B[64x16 s8]    = 2*16*16*64 = 32768 ops */
typedef struct amx_tilecfg {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_tilecfg;

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* The kernel hands out AMX state only after this per-process request (Linux 5.16+). */
static int amx_request_permission(void) {
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

/* CPUID.(7,0):EDX bit 25; dg_cpu_info has only amx_bf16 (bit 22), which already implies
 * that the OS saves tile state (XCR0 bits 17-18). */
static int cpu_has_amx_int8(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return 0;
    return (d >> 25) & 1;
}

/* Palette 1, tiles 0-7 all 16 rows x 64 bytes. Static storage on purpose: GCC 12's
 * _tile_loadconfig and _tile_loadd tell the compiler they read only the first 8 bytes (or
 * nothing) of their operand, so it drops stores into a local config and rows 0 then make
 * TILEZERO fault with SIGILL. Data in static storage is in memory whatever the asm says. */
static const amx_tilecfg amx_cfg = {
    .palette_id = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

/* A and B tile contents, filled by amx_fill_src before any thread starts: bf16 ~9.8e-4
 * everywhere (as int8: 0x80, 0x3a), small enough that fp32 sums stay finite. */
static uint16_t amx_src[16 * 32];

static void amx_fill_src(void) {
    for (int i = 0; i < 16 * 32; ++i)
        amx_src[i] = 0x3a80;
}

/* LDTILECFG is per thread: every loop configures its own tiles and zeroes the accumulators. */
__attribute__((target("amx-tile"))) static void amx_setup(void) {
    _tile_loadconfig(&amx_cfg);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, amx_src, 64);
    _tile_loadd(5, amx_src, 64);
    _tile_loadd(6, amx_src, 64);
    _tile_loadd(7, amx_src, 64);
}

/* Stores the accumulators and releases the tiles; returns a value depending on all four. */
__attribute__((target("amx-tile"))) static double amx_finish(int is_int) {
    float c[4][16 * 16];
    _tile_stored(0, c[0], 64);
    _tile_stored(1, c[1], 64);
    _tile_stored(2, c[2], 64);
    _tile_stored(3, c[3], 64);
    _tile_release();
    double s = 0;
    for (int t = 0; t < 4; ++t) {
        if (is_int) {
            int32_t v;
            memcpy(&v, &c[t][0], sizeof v);
            s += v;
        } else {
            s += c[t][0];
        }
    }
    return s;
}

__attribute__((target("amx-tile,amx-bf16"))) static double loop_amx_bf16(long iters) {
    amx_setup();
    for (long it = 0; it < iters; ++it) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    return amx_finish(0);
}

__attribute__((target("amx-tile,amx-int8"))) static double loop_amx_int8(long iters) {
    amx_setup();
    for (long it = 0; it < iters; ++it) {
        _tile_dpbssd(0, 4, 6);
        _tile_dpbssd(1, 4, 7);
        _tile_dpbssd(2, 5, 6);
        _tile_dpbssd(3, 5, 7);
    }
    return amx_finish(1);
}
#endif /* BENCH_AMX */

/* Operations per second of `loop` on all threads; `ops_per_iter` counts one loop trip.
 * The iteration count is calibrated on one thread to run about `seconds`; best of 3. */
static double measure_loop(double (*loop)(long), double ops_per_iter, int threads, double seconds) {
    loop_arg a = {.loop = loop, .iters = 1 << 16};
    double t;
    for (;;) {
        t = run_parallel(1, loop_thread, &a);
        if (t > 0.02 || a.iters > (1L << 40))
            break;
        a.iters *= 4;
    }
    a.iters = (long)((double)a.iters * seconds / t) + 1;
    double best = 0;
    for (int rep = 0; rep < 3; ++rep) {
        t = run_parallel(threads, loop_thread, &a);
        const double rate = ops_per_iter * (double)a.iters * threads / t;
        if (rate > best)
            best = rate;
    }
    return best;
}

/* ---- DRAM read bandwidth ---- */

typedef struct stream_arg {
    uint64_t *buf;
    size_t words;
    volatile uint64_t sink;
} stream_arg;

static void slice(size_t words, int tid, int nthreads, size_t *lo, size_t *hi) {
    *lo = words / (size_t)nthreads * (size_t)tid;
    *hi = tid == nthreads - 1 ? words : words / (size_t)nthreads * (size_t)(tid + 1);
}

/* First touch from the thread that will read the slice (keeps pages on its NUMA node). */
static void stream_init(int tid, int nthreads, void *p) {
    stream_arg *a = p;
    size_t lo, hi;
    slice(a->words, tid, nthreads, &lo, &hi);
    for (size_t i = lo; i < hi; ++i)
        a->buf[i] = i;
}

static void stream_read(int tid, int nthreads, void *p) {
    stream_arg *a = p;
    size_t lo, hi;
    slice(a->words, tid, nthreads, &lo, &hi);
    /* Four independent sums so the loop is bound by loads, not by an add chain. */
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    size_t i = lo;
    for (; i + 4 <= hi; i += 4) {
        s0 += a->buf[i];
        s1 += a->buf[i + 1];
        s2 += a->buf[i + 2];
        s3 += a->buf[i + 3];
    }
    for (; i < hi; ++i)
        s0 += a->buf[i];
    if (s0 + s1 + s2 + s3 == 42) /* practically never; keeps the sums alive */
        a->sink = s0;
}

/* The largest cache the library detected (the last level; dg_cpu_info.cache_bytes), 0 if unknown. */
size_t bench_llc_bytes(void) {
    dg_cpu_info ci;
    if (dg_get_cpu_info(&ci) != DG_OK)
        return 0;
    int64_t llc = 0;
    for (int l = 1; l <= 3; ++l)
        llc = ci.cache_bytes[l] > llc ? ci.cache_bytes[l] : llc;
    return (size_t)llc;
}

/* max(1 GiB, 4 x last-level cache), at most 4 GiB and a quarter of physical memory. */
static size_t dram_buffer_size(void) {
    const size_t llc = bench_llc_bytes();
    size_t want = (size_t)1 << 30;
    if (4 * llc > want)
        want = 4 * llc;
    if (want > ((size_t)4 << 30))
        want = (size_t)4 << 30;
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0 && want > (size_t)pages * (size_t)page / 4)
        want = (size_t)pages * (size_t)page / 4;
    return want & ~(size_t)63;
}

static double measure_dram(int threads, int passes, size_t *bytes_out) {
    stream_arg a = {0};
    size_t bytes = dram_buffer_size();
    while (bytes >= ((size_t)64 << 20) && !(a.buf = bench_alloc_uninit(bytes)))
        bytes /= 2;
    *bytes_out = a.buf ? bytes : 0;
    if (!a.buf)
        return 0;
    a.words = bytes / sizeof(uint64_t);
    run_parallel(threads, stream_init, &a);
    double best = 0;
    for (int p = 0; p < passes; ++p) {
        const double t = run_parallel(threads, stream_read, &a);
        if ((double)bytes / t > best)
            best = (double)bytes / t;
    }
    bench_free(a.buf);
    return best;
}

void bench_measure_peaks(bench_peaks *p, int threads, int quick) {
    memset(p, 0, sizeof *p);
    p->threads = threads;
    const double secs = quick ? 0.05 : 0.25;
#if BENCH_X86
    dg_cpu_info ci;
    if (dg_get_cpu_info(&ci) == DG_OK) {
        if (ci.avx512f && ci.avx512_bf16)
            p->bf16_gflops = 1e-9 * measure_loop(loop_bf16, 12 * 64.0, threads, secs);
        if (ci.avx2 && ci.fma) /* the limit of isa avx2, also where AVX-512 is present */
            p->fp32_ymm_gflops = 1e-9 * measure_loop(loop_fp32_avx2, 12 * 16.0, threads, secs);
        if (ci.avx512f) {
            p->fp32_gflops = 1e-9 * measure_loop(loop_fp32_avx512, 12 * 32.0, threads, secs);
            p->fp32_isa = "avx512";
        } else if (p->fp32_ymm_gflops > 0) {
            p->fp32_gflops = p->fp32_ymm_gflops;
            p->fp32_isa = "avx2";
        }
        if (ci.avx512f && ci.avx512_vnni)
            p->int8_gops = 1e-9 * measure_loop(loop_int8, 12 * 128.0, threads, secs);
#if BENCH_AMX
        if (ci.amx_bf16 && amx_request_permission()) {
            amx_fill_src();
            p->amx_bf16_gflops = 1e-9 * measure_loop(loop_amx_bf16, 4 * 16384.0, threads, secs);
            if (cpu_has_amx_int8())
                p->amx_int8_gops = 1e-9 * measure_loop(loop_amx_int8, 4 * 32768.0, threads, secs);
        }
#endif
    }
#endif
    p->dram_gbps = 1e-9 * measure_dram(threads, quick ? 2 : 4, &p->dram_buffer_bytes);
}
