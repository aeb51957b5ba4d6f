/* cpu.c - CPU feature detection (once per process) and the ISA level kernels use. */
#define _GNU_SOURCE /* sched_getaffinity */
#include "../core/internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__linux__)
#include <sched.h>
#include <sys/syscall.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define DG_X86 1
#endif

static dg_cpu_info g_info;
/* Features only kernels ask about (not in the public dg_cpu_info): set by detect(). */
static bool g_avx512_vbmi;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static atomic_int g_isa = -1;

static int count_cores(void) {
#if defined(__linux__)
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        const int n = CPU_COUNT(&set);
        if (n > 0)
            return n;
    }
#endif
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

#if DG_X86
static uint64_t read_xcr0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static void detect_x86(dg_cpu_info *ci) {
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d))
        return;
    const unsigned max_leaf = a;
    memcpy(ci->vendor + 0, &b, 4);
    memcpy(ci->vendor + 4, &d, 4);
    memcpy(ci->vendor + 8, &c, 4);
    ci->vendor[12] = '\0';
    __get_cpuid(1, &a, &b, &c, &d);
    const int osxsave = (c >> 27) & 1;
    ci->fma = (c >> 12) & 1;
    const uint64_t xcr0 = osxsave ? read_xcr0() : 0;
    const int os_avx = (xcr0 & 0x6) == 0x6;        /* XMM and YMM state */
    const int os_avx512 = (xcr0 & 0xe6) == 0xe6;   /* plus opmask and ZMM state */
    const int os_amx = (xcr0 & 0x60000) == 0x60000;
    ci->fma = ci->fma && os_avx;
    if (max_leaf >= 7) {
        __get_cpuid_count(7, 0, &a, &b, &c, &d);
        ci->avx2 = os_avx && ((b >> 5) & 1);
        ci->avx512f = os_avx512 && ((b >> 16) & 1);
        ci->avx512bw = os_avx512 && ((b >> 30) & 1);
        ci->avx512vl = os_avx512 && ((b >> 31) & 1);
        ci->avx512_vnni = os_avx512 && ((c >> 11) & 1);
        g_avx512_vbmi = os_avx512 && ((c >> 1) & 1);
        ci->amx_bf16 = os_amx && ((d >> 22) & 1);
        ci->amx_int8 = os_amx && ((d >> 25) & 1);
        __get_cpuid_count(7, 1, &a, &b, &c, &d);
        ci->avx512_bf16 = os_avx512 && ((a >> 5) & 1);
    }
    unsigned ext = 0;
    __get_cpuid(0x80000000u, &ext, &b, &c, &d);
    /* Data and unified caches from the deterministic cache parameters: leaf 4 (Intel), or
     * 0x8000001D (AMD, with topology extensions, ECX bit 22 of 0x80000001). */
    unsigned cache_leaf = 0;
    if (strcmp(ci->vendor, "GenuineIntel") == 0 && max_leaf >= 4) {
        cache_leaf = 4;
    } else if (ext >= 0x8000001Du) {
        __get_cpuid(0x80000001u, &a, &b, &c, &d);
        cache_leaf = (c >> 22) & 1 ? 0x8000001Du : 0;
    }
    for (unsigned sub = 0; cache_leaf && sub < 16; ++sub) {
        __get_cpuid_count(cache_leaf, sub, &a, &b, &c, &d);
        const unsigned type = a & 31, level = (a >> 5) & 7;
        if (type == 0)
            break;
        if ((type == 1 || type == 3) && level >= 1 && level <= 3)
            ci->cache_bytes[level] = (int64_t)((b >> 22) + 1) * (((b >> 12) & 1023) + 1) * ((b & 4095) + 1) * ((int64_t)c + 1);
    }
    if (ext >= 0x80000004u) {
        unsigned *w = (unsigned *)ci->brand;
        for (unsigned leaf = 0; leaf < 3; ++leaf)
            __get_cpuid(0x80000002u + leaf, &w[4 * leaf], &w[4 * leaf + 1], &w[4 * leaf + 2], &w[4 * leaf + 3]);
        ci->brand[48] = '\0';
    }
}

#if defined(DG_HAVE_AMX)
/* Linux hands out AMX tile state only after a per-process request (5.16+); without it the
 * first tile instruction faults. Other systems: not supported here. */
static int request_amx(void) {
#if defined(__linux__) && defined(SYS_arch_prctl)
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
    return 0;
#endif
}
#endif
#endif

/* Linux's view of cpu0's caches, where CPUID said nothing (other architectures, old CPUs). */
static void detect_caches_sysfs(void) {
#if defined(__linux__)
    for (int idx = 0; idx < 8; ++idx) {
        char path[96], buf[32];
        int level = 0;
        int64_t kib = 0;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", idx);
        FILE *f = fopen(path, "r");
        if (!f)
            break;
        const int data = fgets(buf, sizeof buf, f) && strncmp(buf, "Instruction", 11) != 0;
        fclose(f);
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", idx);
        if ((f = fopen(path, "r"))) {
            if (fscanf(f, "%d", &level) != 1)
                level = 0;
            fclose(f);
        }
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", idx);
        if ((f = fopen(path, "r"))) {
            long long v = 0;
            char unit = 'K';
            if (fscanf(f, "%lld%c", &v, &unit) >= 1 && v > 0)
                kib = unit == 'M' ? v * 1024 : v;
            fclose(f);
        }
        if (data && level >= 1 && level <= 3 && kib > 0 && g_info.cache_bytes[level] == 0)
            g_info.cache_bytes[level] = kib * 1024;
    }
#endif
}

static dg_isa isa_from_env(dg_isa best) {
    const char *s = getenv("DG_ISA");
    if (!s || !*s)
        return best;
    static const struct { const char *name; dg_isa isa; } kNames[] = {
        {"generic", DG_ISA_GENERIC}, {"avx2", DG_ISA_AVX2}, {"avx512", DG_ISA_AVX512},
        {"avx512_bf16", DG_ISA_AVX512_BF16}, {"amx", DG_ISA_AMX}};
    for (size_t i = 0; i < sizeof kNames / sizeof kNames[0]; ++i)
        if (strcmp(s, kNames[i].name) == 0)
            return kNames[i].isa <= best ? kNames[i].isa : best;
    return best; /* unknown names keep the detected level */
}

static void detect(void) {
    memset(&g_info, 0, sizeof g_info);
    strcpy(g_info.vendor, "unknown");
    strcpy(g_info.brand, "unknown");
    g_info.logical_cores = count_cores();
#if DG_X86
    detect_x86(&g_info);
#endif
    detect_caches_sysfs();
    dg_isa best = DG_ISA_GENERIC;
    if (g_info.avx2 && g_info.fma)
        best = DG_ISA_AVX2;
    if (best == DG_ISA_AVX2 && g_info.avx512f && g_info.avx512bw && g_info.avx512vl)
        best = DG_ISA_AVX512;
    if (best == DG_ISA_AVX512 && g_info.avx512_bf16 && g_info.avx512_vnni)
        best = DG_ISA_AVX512_BF16;
#if DG_X86 && defined(DG_HAVE_AMX)
    if (best == DG_ISA_AVX512_BF16 && g_info.amx_bf16 && g_info.amx_int8)
        g_info.amx_usable = request_amx();
    if (g_info.amx_usable)
        best = DG_ISA_AMX;
#endif
    g_info.best_isa = best;
    atomic_store(&g_isa, (int)isa_from_env(best));
}

const dg_cpu_info *dg_cpu(void) {
    pthread_once(&g_once, detect);
    return &g_info;
}

int64_t dg_cpu_cache_bytes(int level) {
    pthread_once(&g_once, detect);
    return level >= 1 && level <= 3 ? g_info.cache_bytes[level] : 0;
}

bool dg_cpu_has_avx512_vbmi(void) {
    pthread_once(&g_once, detect);
    return g_avx512_vbmi;
}

dg_status dg_get_cpu_info(dg_cpu_info *out) {
    dg_api_begin("dg_get_cpu_info");
    DG_CHECK(out != NULL, DG_ERR_NULL_POINTER, "argument 'out' is NULL");
    *out = *dg_cpu();
    return DG_OK;
}

const char *dg_isa_name(dg_isa isa) {
    switch (isa) {
    case DG_ISA_GENERIC: return "generic";
    case DG_ISA_AVX2: return "avx2";
    case DG_ISA_AVX512: return "avx512";
    case DG_ISA_AVX512_BF16: return "avx512_bf16";
    case DG_ISA_AMX: return "amx";
    }
    return "unknown";
}

dg_isa dg_get_isa(void) {
    pthread_once(&g_once, detect);
    return (dg_isa)atomic_load(&g_isa);
}

dg_status dg_set_isa(dg_isa isa) {
    dg_api_begin("dg_set_isa");
    pthread_once(&g_once, detect);
    DG_CHECK(isa >= DG_ISA_GENERIC && isa <= DG_ISA_AMX, DG_ERR_VALUE, "argument 'isa' is an unknown ISA level %d",
             (int)isa);
    DG_CHECK(isa <= g_info.best_isa, DG_ERR_UNSUPPORTED, "argument 'isa': this CPU does not support %s (best: %s)",
             dg_isa_name(isa), dg_isa_name(g_info.best_isa));
    atomic_store(&g_isa, (int)isa);
    return DG_OK;
}
