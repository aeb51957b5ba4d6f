/*
 * test_jit.c - the runtime JIT (src/jit/jit.h) and the engine family it serves (the small-M
 * AVX2 microkernels, src/engine/jit_ukr.c), in a temporary DG_JIT_CACHE_DIR:
 *   keys: stable, and new for a changed constant, flag or embedded source;
 *   the disk cache across processes (this program runs itself in a child mode): a miss compiles,
 *   a new process loads from disk; a truncated, corrupted, manifest-less, symlinked,
 *   world-writable, group-writable or foreign-owned entry is rebuilt, not loaded; four processes
 *   racing on an empty cache all succeed and leave one entry; ':'-separated lists (first hit
 *   wins, misses compile into the first); DG_JIT_DUMP_ASM;
 *   fallbacks: DG_JIT=0, no compiler (DG_JIT_CC=/nonexistent, or none on PATH), a compile error,
 *   an unusable cache directory: NULL, and GEMMs give the built-in bits;
 *   the JIT's kernels against the built-in ones, bitwise: every MR and mode at the constant
 *   and variable k extents, and GEMMs with M = 1 .. 17, N and K tails, BF16 and FP8 with
 *   per-block scales, with and without K as a compiled dimension.
 * It prints (does not assert) the first compile time, the load time from disk in a new process
 * and the in-process lookup time. `test_jit --bench [reps]` times built-in against JIT kernels
 * on the small-M decoding shapes (not part of ctest).
 */
#define _GNU_SOURCE
#include "test_gemm_dense_util.h"

#include "engine/engine.h"
#include "engine/jit_ukr.h"
#include "jit/jit.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static char g_root[256], g_self[4096];

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* This thread's CPU time: lookups timed on a shared machine without other processes' share. */
static double cpu_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* ---- the probe kernel: a tiny unit that compiles in tens of milliseconds ------------------- */

#define PROBE_SOURCE "test/jit_probe.h"
static const char *kProbe = "long DG_JIT_SYMBOL(long x);\n"
                            "long DG_JIT_SYMBOL(long x) { return x * DG_TEST_MUL + DG_TEST_ADD; }\n";

static dg_jit_desc probe_desc(long add) {
    dg_jit_desc d = {.family = "probe", .symbol = "dg_jit_probe", .nconsts = 2, .nsources = 1, .flags = "-w"};
    d.consts[0] = (dg_jit_const){"DG_TEST_MUL", 3};
    d.consts[1] = (dg_jit_const){"DG_TEST_ADD", add};
    d.sources[0] = PROBE_SOURCE;
    return d;
}

static void probe_key(long add, char key[33]) {
    const dg_jit_desc d = probe_desc(add);
    if (!dg_jit_key(&d, key))
        key[0] = '\0';
}

#if defined(__x86_64__) || defined(__i386__)
#define HAVE_AVX2_KERNELS 1
/* The AVX2 small-M kernel the engine would run for MR rows, k extents (step, kp). */
static dg_ukr_fn builtin_small(int mr) {
    return mr == 1   ? dg_ukr_f32_avx2_mr1
           : mr == 2 ? dg_ukr_f32_avx2_mr2
           : mr == 4 ? dg_ukr_f32_avx2_mr4
                     : dg_ukr_f32_avx2;
}

static dg_ukr_fn jit_small(int mr, int64_t step, int64_t kp) {
    const dg_ukr_fn b = builtin_small(mr);
    const dg_ukr_fn f = dg_engine_jit_small_ukr(dg_engine_config(DG_ISA_AVX2), b, mr, step, kp, mr, 16, kp);
    return f == b ? NULL : f;
}
#else
#define HAVE_AVX2_KERNELS 0
static dg_ukr_fn jit_small(int mr, int64_t step, int64_t kp) {
    (void)mr, (void)step, (void)kp;
    return NULL;
}
#endif

/* ---- child modes ------------------------------------------------------------------------------ */

static void print_stats(int ok, long value) {
    dg_jit_stats s;
    dg_jit_get_stats(&s);
    printf("ok=%d value=%ld compiles=%ld loads=%ld rebuilds=%ld failures=%ld load_ms=%.3f compile_ms=%.3f\n", ok,
           value, s.compiles, s.disk_loads, s.rebuilds, s.failures, s.last_load_ms, s.last_compile_ms);
}

static int child(int argc, char **argv) {
    const char *mode = argv[2];
    if (!strcmp(mode, "probe")) {
        const long add = argc > 3 ? atol(argv[3]) : 0;
        dg_jit_set_source(PROBE_SOURCE, kProbe);
        const dg_jit_desc d = probe_desc(add);
        long (*fn)(long) = (long (*)(long))dg_jit_get(&d);
        print_stats(fn != NULL, fn ? fn(14) : 0);
        return 0;
    }
    if (!strcmp(mode, "ukr")) { /* the real kernel: load time from disk in a new process */
        dg_engine_set_jit(1);
        const double t0 = now_ms();
        const dg_ukr_fn f = jit_small(4, 128, 302);
        const double ms = now_ms() - t0;
        print_stats(f != NULL, (long)(ms * 1000));
        return 0;
    }
    if (!strcmp(mode, "gemm")) { /* with the JIT asked for: the built-in bits whatever happens */
        tu_rng r = {77};
        top a = top_make(&r, DG_BFLOAT16, 3, 301, 0, 0, 0, 0, 0), b = top_make(&r, DG_BFLOAT16, 37, 301, 0, 0, 0, 0, 0);
        dg_tensor d0 = tu_alloc2(DG_FLOAT32, 3, 37), d1 = tu_alloc2(DG_FLOAT32, 3, 37);
        dg_engine_set_jit(0);
        const dg_status s0 = dg_bf16_gemm_nt(&a.t, &b.t, &d0, NULL);
        dg_engine_set_jit(1);
        const dg_status s1 = dg_bf16_gemm_nt(&a.t, &b.t, &d1, NULL);
        const int same = s0 == DG_OK && s1 == DG_OK && memcmp(d0.data, d1.data, 3 * 37 * sizeof(float)) == 0;
        top_free(&a), top_free(&b), tu_free(&d0), tu_free(&d1); /* LeakSanitizer checks children too */
        print_stats(same, 0);
        return 0;
    }
    fprintf(stderr, "test_jit: unknown child mode %s\n", mode);
    return 2;
}

/* ---- spawning children ------------------------------------------------------------------------ */

typedef struct kv {
    const char *k, *v; /* v NULL: unset */
} kv;

typedef struct proc {
    pid_t pid;
    int fd;
} proc;

static bool start(proc *p, const char *mode, const char *arg, const kv *env, int nenv) {
    static char *store[1024];
    int n = 0;
    for (char **e = environ; *e && n < 1000; ++e) {
        bool drop = false;
        for (int i = 0; i < nenv; ++i) {
            const size_t len = strlen(env[i].k);
            drop |= !strncmp(*e, env[i].k, len) && (*e)[len] == '=';
        }
        if (!drop)
            store[n++] = *e;
    }
    char buf[16][1100];
    for (int i = 0; i < nenv && i < 16; ++i)
        if (env[i].v) {
            snprintf(buf[i], sizeof buf[i], "%s=%s", env[i].k, env[i].v);
            store[n++] = buf[i];
        }
    store[n] = NULL;
    int fds[2];
    if (pipe(fds) != 0)
        return false;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    char *argv[] = {g_self, "--child", (char *)mode, (char *)(arg ? arg : "0"), NULL};
    const int err = posix_spawn(&p->pid, g_self, &fa, NULL, argv, store);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    if (err) {
        close(fds[0]);
        return false;
    }
    p->fd = fds[0];
    return true;
}

typedef struct result {
    int ran, ok;
    long value, compiles, loads, rebuilds, failures;
    double load_ms, compile_ms;
} result;

static result finish(proc *p) {
    result r;
    memset(&r, 0, sizeof r);
    char out[2048];
    size_t n = 0;
    ssize_t got;
    while (n + 1 < sizeof out && ((got = read(p->fd, out + n, sizeof out - 1 - n)) > 0 || (got < 0 && errno == EINTR)))
        if (got > 0)
            n += (size_t)got;
    out[n] = '\0';
    close(p->fd);
    int status = 0;
    waitpid(p->pid, &status, 0);
    r.ran = WIFEXITED(status) && WEXITSTATUS(status) == 0 &&
            sscanf(out, "ok=%d value=%ld compiles=%ld loads=%ld rebuilds=%ld failures=%ld load_ms=%lf compile_ms=%lf",
                   &r.ok, &r.value, &r.compiles, &r.loads, &r.rebuilds, &r.failures, &r.load_ms,
                   &r.compile_ms) == 8;
    if (!r.ran)
        fprintf(stderr, "child output: %s (status %d)\n", out, status);
    return r;
}

static result run_child(const char *mode, const char *arg, const kv *env, int nenv) {
    proc p;
    result r;
    memset(&r, 0, sizeof r);
    if (start(&p, mode, arg, env, nenv))
        r = finish(&p);
    return r;
}

/* A probe child in cache directory list `dirs`. */
static result probe_in(const char *dirs, long add) {
    char arg[32];
    snprintf(arg, sizeof arg, "%ld", add);
    const kv env[] = {{"DG_JIT_CACHE_DIR", dirs}, {"DG_JIT", NULL}};
    return run_child("probe", arg, env, 2);
}

static void path_in(char *out, size_t size, const char *dir, const char *family, const char *key, const char *ext) {
    snprintf(out, size, "%s/%s-%s.%s", dir, family, key, ext);
}

static void new_dir(char *out, size_t size, const char *name) {
    snprintf(out, size, "%s/%s", g_root, name);
    mkdir(out, 0700);
}

/* Entries (.so files) and leftover temporary directories in dir. */
static void count_dir(const char *dir, int *so, int *manifests, int *tmps) {
    *so = *manifests = *tmps = 0;
    DIR *d = opendir(dir);
    if (!d)
        return;
    for (struct dirent *e; (e = readdir(d));) {
        const size_t n = strlen(e->d_name);
        *so += n > 3 && !strcmp(e->d_name + n - 3, ".so");
        *manifests += n > 9 && !strcmp(e->d_name + n - 9, ".manifest");
        *tmps += !strncmp(e->d_name, ".tmp-", 5);
    }
    closedir(d);
}

static int rm_rf(const char *path) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    return system(cmd);
}

/* ---- tests ------------------------------------------------------------------------------------ */

static void test_keys(void) {
    char k1[33], k2[33], k3[33], k4[33];
    dg_jit_desc d = probe_desc(1);
    char text[512];
    dg_jit_desc_text(&d, text, sizeof text);
    TU_CHECK(!strcmp(text, "family=probe symbol=dg_jit_probe consts=DG_TEST_MUL=3,DG_TEST_ADD=1 "
                           "sources=test/jit_probe.h flags=-w"),
             "canonical text: %s", text);
    TU_CHECK(dg_jit_key(&d, k1) && dg_jit_key(&d, k2) && !strcmp(k1, k2), "a key is stable");
    d.consts[1].value = 2;
    TU_CHECK(dg_jit_key(&d, k3) && strcmp(k1, k3), "a changed constant gives a new key");
    d.consts[1].value = 1;
    d.flags = "-w -DX=1";
    TU_CHECK(dg_jit_key(&d, k3) && strcmp(k1, k3), "changed flags give a new key");
    d.flags = "-w";
    dg_jit_set_source(PROBE_SOURCE, "long DG_JIT_SYMBOL(long x) { return x; }\n");
    TU_CHECK(dg_jit_key(&d, k3) && strcmp(k1, k3), "a changed source gives a new key");
    dg_jit_set_source(PROBE_SOURCE, kProbe);
    TU_CHECK(dg_jit_key(&d, k3) && !strcmp(k1, k3), "the old source gives the old key");

    /* An embedded kernel header: every key covers every embedded source. */
    size_t len = 0;
    const char *body = dg_jit_source("kernels/avx2/ukr_f32_avx2.h", &len);
    TU_CHECK(body && len > 100 && strstr(body, "dg_ukr_f32_avx2_body"), "the AVX2 kernel body is embedded");
    TU_CHECK(dg_jit_source("kernels/avx2/ukr_f32_avx2_jit.h", NULL) != NULL, "its JIT unit is embedded");
    if (body) {
        char *changed = malloc(len + 32);
        memcpy(changed, body, len);
        strcpy(changed + len, "\n/* changed */\n");
        dg_jit_set_source("kernels/avx2/ukr_f32_avx2.h", changed);
        TU_CHECK(dg_jit_key(&d, k4) && strcmp(k1, k4), "a changed embedded header gives a new key");
        dg_jit_set_source("kernels/avx2/ukr_f32_avx2.h", NULL);
        TU_CHECK(dg_jit_key(&d, k4) && !strcmp(k1, k4), "the embedded text restored, the old key");
        free(changed);
    }
    dg_jit_desc bad = d;
    bad.sources[0] = "../etc/passwd";
    TU_CHECK(dg_jit_get(&bad) == NULL, "a source outside src/ is refused");
    bad = d;
    bad.sources[0] = "not/embedded.h";
    TU_CHECK(!dg_jit_key(&bad, k4) && dg_jit_get(&bad) == NULL, "a source that is not embedded: no key, NULL");
}

static void test_cache(bool root) {
    char c1[300], key[33], so[400], man[400];
    new_dir(c1, sizeof c1, "c1");
    probe_key(5, key);
    path_in(so, sizeof so, c1, "probe", key, "so");
    path_in(man, sizeof man, c1, "probe", key, "manifest");

    result r = probe_in(c1, 5);
    TU_CHECK(r.ran && r.ok && r.value == 47 && r.compiles == 1 && r.loads == 0,
             "a miss compiles (ok %d value %ld compiles %ld)", r.ok, r.value, r.compiles);
    printf("probe kernel: first compile %.1f ms\n", r.compile_ms);
    r = probe_in(c1, 5);
    TU_CHECK(r.ran && r.ok && r.value == 47 && r.compiles == 0 && r.loads == 1,
             "a new process loads it from disk (compiles %ld loads %ld)", r.compiles, r.loads);
    printf("probe kernel: load from disk in a new process %.3f ms\n", r.load_ms);

    /* Damaged or unsafe entries: each is rebuilt (one refusal, one compile), then loads. */
    struct {
        const char *what;
        int kind;
    } cases[] = {{"truncated", 0},       {"one byte changed", 1}, {"manifest missing", 2},       {"a symbolic link", 3},
                 {"world-writable", 4}, {"group-writable manifest", 5}, {"owned by another user", 6}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        const int kind = cases[i].kind;
        if (kind == 6 && !root) {
            printf("skip: a foreign-owned entry needs chown, which only root may do (euid %d)\n", (int)geteuid());
            continue;
        }
        struct stat st;
        TU_CHECK(stat(so, &st) == 0, "%s: the entry exists", cases[i].what);
        bool arranged = true;
        if (kind == 0) {
            arranged = truncate(so, st.st_size / 2) == 0;
        } else if (kind == 1) {
            const int fd = open(so, O_RDWR);
            unsigned char c = 0;
            arranged = fd >= 0 && pread(fd, &c, 1, st.st_size / 2) == 1;
            c ^= 0x40;
            arranged = arranged && pwrite(fd, &c, 1, st.st_size / 2) == 1;
            if (fd >= 0)
                close(fd);
        } else if (kind == 2) {
            arranged = unlink(man) == 0;
        } else if (kind == 3) { /* a link to a valid copy: still refused */
            char copy[420];
            snprintf(copy, sizeof copy, "%s/elsewhere.so", g_root);
            char cmd[900];
            snprintf(cmd, sizeof cmd, "cp -p '%s' '%s'", so, copy);
            arranged = system(cmd) == 0 && unlink(so) == 0 && symlink(copy, so) == 0;
        } else if (kind == 4) {
            arranged = chmod(so, 0666) == 0;
        } else if (kind == 5) {
            arranged = chmod(man, 0664) == 0;
        } else {
            arranged = chown(so, 65534, 65534) == 0;
        }
        TU_CHECK(arranged, "%s: arranged (%s)", cases[i].what, strerror(errno));
        r = probe_in(c1, 5);
        TU_CHECK(r.ran && r.ok && r.value == 47 && r.rebuilds == 1 && r.compiles == 1 && r.loads == 0,
                 "%s: rebuilt, not loaded (rebuilds %ld compiles %ld loads %ld)", cases[i].what, r.rebuilds, r.compiles,
                 r.loads);
        r = probe_in(c1, 5);
        TU_CHECK(r.ran && r.ok && r.loads == 1 && r.compiles == 0, "%s: the rebuilt entry loads", cases[i].what);
        TU_CHECK(lstat(so, &st) == 0 && S_ISREG(st.st_mode) && !(st.st_mode & 022) && st.st_uid == geteuid(),
                 "%s: the rebuilt entry is a regular file of ours, mode %o", cases[i].what, (unsigned)st.st_mode);
    }

    /* ':'-separated lists: the first hit wins, a miss compiles into the first directory. */
    char c3[300], list[700], nd[300];
    new_dir(c3, sizeof c3, "c3");
    snprintf(nd, sizeof nd, "%s/not-a-dir", g_root);
    const int fd = open(nd, O_WRONLY | O_CREAT, 0600);
    if (fd >= 0)
        close(fd);
    snprintf(list, sizeof list, "%s:%s", c3, c1);
    r = probe_in(list, 5);
    TU_CHECK(r.ran && r.ok && r.loads == 1 && r.compiles == 0, "a hit in the second directory of the list");
    r = probe_in(list, 6);
    char key6[33], so6[400];
    probe_key(6, key6);
    path_in(so6, sizeof so6, c3, "probe", key6, "so");
    TU_CHECK(r.ran && r.ok && r.value == 48 && r.compiles == 1 && access(so6, F_OK) == 0,
             "a miss compiles into the first directory");
    snprintf(list, sizeof list, "%s/sub:%s", nd, c1);
    r = probe_in(list, 5);
    TU_CHECK(r.ran && r.ok && r.loads == 1, "an unusable first directory does not hide a hit in the second");

    /* DG_JIT_DUMP_ASM: the assembly beside the entry. */
    char c4[300], s4[400];
    new_dir(c4, sizeof c4, "c4");
    const kv env[] = {{"DG_JIT_CACHE_DIR", c4}, {"DG_JIT_DUMP_ASM", "1"}};
    r = run_child("probe", "9", env, 2);
    char key9[33];
    probe_key(9, key9);
    path_in(s4, sizeof s4, c4, "probe", key9, "s");
    TU_CHECK(r.ran && r.ok && r.value == 51 && access(s4, F_OK) == 0, "DG_JIT_DUMP_ASM writes %s", s4);
}

static void test_race(void) {
    char c2[300];
    new_dir(c2, sizeof c2, "c2");
    proc p[4];
    bool started = true;
    const kv env[] = {{"DG_JIT_CACHE_DIR", c2}, {"DG_JIT", NULL}};
    for (int i = 0; i < 4; ++i)
        started &= start(&p[i], "probe", "7", env, 2);
    TU_CHECK(started, "four children started");
    long compiles = 0;
    for (int i = 0; i < 4 && started; ++i) {
        const result r = finish(&p[i]);
        TU_CHECK(r.ran && r.ok && r.value == 49, "racer %d succeeds (ok %d value %ld)", i, r.ok, r.value);
        compiles += r.compiles;
    }
    int so, manifests, tmps;
    count_dir(c2, &so, &manifests, &tmps);
    TU_CHECK(so == 1 && manifests == 1 && tmps == 0, "one entry after the race (%d .so, %d manifests, %d temporaries)",
             so, manifests, tmps);
    printf("race of four processes on an empty cache: %ld compile(s)\n", compiles);
    const result r = probe_in(c2, 7);
    TU_CHECK(r.ran && r.ok && r.loads == 1 && r.compiles == 0, "the raced entry loads in a new process");
}

static void test_fallbacks(bool root) {
    char c5[300], nd[300];
    snprintf(nd, sizeof nd, "%s/not-a-dir", g_root);
    const int nfd = open(nd, O_WRONLY | O_CREAT, 0600);
    if (nfd >= 0)
        close(nfd);
    new_dir(c5, sizeof c5, "c5");
    const kv nocc[] = {{"DG_JIT_CACHE_DIR", c5}, {"DG_JIT_CC", "/nonexistent"}};
    result r = run_child("probe", "3", nocc, 2);
    TU_CHECK(r.ran && !r.ok && r.compiles == 0, "DG_JIT_CC=/nonexistent: NULL");
    r = run_child("gemm", NULL, nocc, 2);
    TU_CHECK(r.ran && r.ok, "DG_JIT_CC=/nonexistent: a GEMM gives the built-in bits");
    const kv nopath[] = {{"DG_JIT_CACHE_DIR", c5}, {"DG_JIT_CC", NULL}, {"CC", NULL}, {"PATH", "/nonexistent-dir"}};
    r = run_child("probe", "3", nopath, 4);
    TU_CHECK(r.ran && !r.ok && r.compiles == 0, "no cc on PATH: NULL");
    const kv off[] = {{"DG_JIT_CACHE_DIR", c5}, {"DG_JIT", "0"}};
    r = run_child("probe", "3", off, 2);
    TU_CHECK(r.ran && !r.ok && r.compiles == 0, "DG_JIT=0: NULL");
    r = run_child("gemm", NULL, off, 2);
    TU_CHECK(r.ran && r.ok, "DG_JIT=0: a GEMM gives the built-in bits");
    int so, manifests, tmps;
    count_dir(c5, &so, &manifests, &tmps);
    TU_CHECK(so == 0 && tmps == 0, "nothing written without a compiler or with DG_JIT=0");

    char bad[400];
    snprintf(bad, sizeof bad, "%s/not-a-dir/cache", g_root); /* unwritable even for root */
    const kv unw[] = {{"DG_JIT_CACHE_DIR", bad}, {"DG_JIT", NULL}};
    r = run_child("probe", "3", unw, 2);
    TU_CHECK(r.ran && !r.ok, "a cache directory that cannot be created: NULL");
    r = run_child("gemm", NULL, unw, 2);
    TU_CHECK(r.ran && r.ok, "an unusable cache directory: a GEMM gives the built-in bits");
    char ro[300];
    new_dir(ro, sizeof ro, "readonly");
    chmod(ro, 0500);
    if (!root) {
        const kv rod[] = {{"DG_JIT_CACHE_DIR", ro}, {"DG_JIT", NULL}};
        r = run_child("probe", "3", rod, 2);
        TU_CHECK(r.ran && !r.ok, "a read-only cache directory: NULL");
    } else {
        printf("skip: a read-only directory does not stop root (tested with a path through a regular file)\n");
    }
    char open_dir[300];
    new_dir(open_dir, sizeof open_dir, "open");
    chmod(open_dir, 0777);
    const kv od[] = {{"DG_JIT_CACHE_DIR", open_dir}, {"DG_JIT", NULL}};
    r = run_child("probe", "3", od, 2);
    count_dir(open_dir, &so, &manifests, &tmps);
    TU_CHECK(r.ran && !r.ok && so == 0, "a cache directory writable by others (not sticky) is not used");

    /* A compile error, in this process: NULL, and not retried. */
    dg_jit_set_source("test/broken.h", "this is not C;\n");
    dg_jit_desc d = probe_desc(1);
    d.sources[0] = "test/broken.h";
    dg_jit_stats s0, s1;
    dg_jit_get_stats(&s0);
    const double t0 = now_ms();
    TU_CHECK(dg_jit_get(&d) == NULL, "a unit that does not compile: NULL");
    const double t1 = now_ms();
    TU_CHECK(dg_jit_get(&d) == NULL, "again NULL");
    const double t2 = now_ms();
    dg_jit_get_stats(&s1);
    TU_CHECK(s1.compiles == s0.compiles && t2 - t1 < (t1 - t0) / 4 + 1,
             "a failed compile is not retried (%.1f then %.3f ms)", t1 - t0, t2 - t1);
}

#if HAVE_AVX2_KERNELS
/* The JIT's instances against the built-in kernels on random panels. */
static void test_kernels(void) {
    tu_rng r = {12345};
    const int64_t kp = 302, step = 128; /* calls of 128, the tail 46 */
    float *a = malloc(6 * kp * sizeof(float) + 64), *b = malloc(16 * kp * sizeof(float) + 64);
    float c0[6 * 24], c1[6 * 24], sa[6], sb[16];
    tu_fill_normal(&r, a, (size_t)(6 * kp), 1.0f);
    tu_fill_normal(&r, b, (size_t)(16 * kp), 1.0f);
    tu_fill_normal(&r, sa, 6, 1.0f);
    tu_fill_normal(&r, sb, 16, 1.0f);
    static const int kMr[4] = {1, 2, 4, 6};
    dg_engine_set_jit(1);
    for (int i = 0; i < 4; ++i) {
        const int mr = kMr[i];
        const dg_ukr_fn f = jit_small(mr, step, kp), g = builtin_small(mr);
        TU_CHECK(f != NULL, "MR %d: the JIT compiled its kernel", mr);
        if (!f)
            continue;
        static const int64_t kKc[4] = {128, 46, 300, 2};
        for (int mode = 0; mode < 3; ++mode)
            for (int q = 0; q < 4; ++q)
                for (int ldc = 16; ldc <= 24; ldc += 8) {
                    tu_fill_normal(&r, c0, sizeof c0 / sizeof c0[0], 4.0f);
                    memcpy(c1, c0, sizeof c0);
                    g(kKc[q], a, b, c0, ldc, mode, sa, sb);
                    f(kKc[q], a, b, c1, ldc, mode, sa, sb);
                    TU_CHECK(!memcmp(c0, c1, sizeof c0), "MR %d mode %d kc %lld ldc %d: the built-in bits", mr, mode,
                             (long long)kKc[q], ldc);
                }
    }
    dg_engine_set_jit(-2);
    free(a);
    free(b);
}
#else
static void test_kernels(void) {}
#endif

/* GEMMs with the engine's JIT on and off: the same bits; the path report names the JIT. */
static void test_gemms(void) {
    tu_rng r = {99};
    dg_engine_set_decode(0); /* M <= 2 runs the small-M kernels, not the decode kernels */
    dg_set_print_paths(2);
    dg_clear_path_report();
    static const int64_t kM[] = {1, 2, 3, 5, 17}, kN[] = {37, 130}, kK[] = {301, 8};
    for (size_t ki = 0; ki < 2; ++ki)
        for (size_t mi = 0; mi < sizeof kM / sizeof kM[0]; ++mi)
            for (size_t ni = 0; ni < 2; ++ni) {
                const int64_t m = kM[mi], n = kN[ni], k = kK[ki];
                if (k == 8 && mi > 0) /* K = 8 (only a tail): M = 1 (fewer compiles) */
                    continue;
                top a = top_make(&r, DG_BFLOAT16, m, k, 0, 0, 0, 0, 0);
                top b = top_make(&r, DG_BFLOAT16, n, k, ni == 1, 0, 0, 0, 0); /* N = 130: MN-major B */
                dg_tensor d0 = tg_out(&r, DG_BFLOAT16, m, n, 3, 1), d1 = d0;
                d1.data = malloc((size_t)(m * (n + 3) + 1) * 2);
                memcpy(d1.data, d0.data, (size_t)(m * (n + 3) + 1) * 2);
                dg_engine_set_jit(0);
                TU_CHECK_OK(dg_bf16_gemm_nt(&a.t, &b.t, &d0, &d0));
                dg_engine_set_jit(1);
                TU_CHECK_OK(dg_bf16_gemm_nt(&a.t, &b.t, &d1, &d1));
                TU_CHECK(!memcmp(d0.data, d1.data, (size_t)(m * (n + 3)) * 2),
                         "BF16 m %lld n %lld k %lld: the built-in bits", (long long)m, (long long)n, (long long)k);
                free(d0.data);
                free(d1.data);
                top_free(&a);
                top_free(&b);
            }
    /* FP8 with float scales per 128 (the SCALE epilogue), K as a constant or not. */
    static const char *kDims[] = {NULL, "", "mn"};
    for (int di = 0; di < 3; ++di) {
        const int64_t m = 3, n = 37, k = 301;
        top a = top_make(&r, DG_FLOAT8_E4M3, m, k, 0, 1, 128, 0, 0);
        top b = top_make(&r, DG_FLOAT8_E4M3, n, k, 0, 128, 128, 0, 0);
        dg_gemm_options o = dg_gemm_options_default();
        o.compiled_dims = kDims[di];
        dg_tensor d0 = tu_alloc2(DG_FLOAT32, m, n), d1 = tu_alloc2(DG_FLOAT32, m, n);
        dg_engine_set_jit(0);
        TU_CHECK_OK(dg_fp8_gemm_nt(&a.t, &a.sf, &b.t, &b.sf, &d0, NULL, &o));
        dg_engine_set_jit(1);
        TU_CHECK_OK(dg_fp8_gemm_nt(&a.t, &a.sf, &b.t, &b.sf, &d1, NULL, &o));
        TU_CHECK(!memcmp(d0.data, d1.data, (size_t)(m * n) * 4),
                 "FP8 1x128/128x128, compiled_dims %s: the built-in bits", kDims[di] ? kDims[di] : "(default nk)");
        tu_free(&d0);
        tu_free(&d1);
        top_free(&a);
        top_free(&b);
    }
    char rep[8192];
    dg_get_path_report(rep, sizeof rep);
    TU_CHECK(strstr(rep, "from the runtime JIT (MR 1, kc constant)") && strstr(rep, "(MR 6, kc constant)") &&
                 strstr(rep, "(MR 4, kc variable)"),
             "the path report names the JIT's kernels:\n%s", rep);
    /* dg_set_ignore_compile_dims: K is not compiled in even when named. */
    dg_clear_path_report();
    dg_set_ignore_compile_dims(1);
    {
        top a = top_make(&r, DG_BFLOAT16, 3, 301, 0, 0, 0, 0, 0), b = top_make(&r, DG_BFLOAT16, 37, 301, 0, 0, 0, 0, 0);
        dg_tensor d1 = tu_alloc2(DG_FLOAT32, 3, 37);
        TU_CHECK_OK(dg_bf16_gemm_nt(&a.t, &b.t, &d1, NULL));
        dg_get_path_report(rep, sizeof rep);
        TU_CHECK(strstr(rep, "(MR 4, kc variable)") != NULL, "ignore_compile_dims: kc variable:\n%s", rep);
        tu_free(&d1);
        top_free(&a);
        top_free(&b);
    }
    dg_set_ignore_compile_dims(0);
    dg_set_print_paths(0);
    dg_engine_set_decode(1);
    dg_engine_set_jit(-2);
}

static void timings(bool avx2) {
    char main_dir[300];
    snprintf(main_dir, sizeof main_dir, "%s/main", g_root);
    if (avx2) { /* the decoding shape's kernel: compiled here, loaded by a new process */
        dg_engine_set_jit(1);
        const double t0 = now_ms();
        const dg_ukr_fn f = jit_small(4, 128, 302);
        const double ms = now_ms() - t0;
        dg_engine_set_jit(-2);
        TU_CHECK(f != NULL, "the MR 4, kc 128 kernel compiles");
        printf("AVX2 small-M kernel (MR 4, kc 128, tail 46): first compile %.1f ms\n", ms);
        const kv env[] = {{"DG_JIT_CACHE_DIR", main_dir}, {"DG_JIT", NULL}};
        const result r = run_child("ukr", NULL, env, 2);
        TU_CHECK(r.ran && r.ok && r.loads == 1 && r.compiles == 0, "a new process loads the AVX2 kernel from disk");
        printf("AVX2 small-M kernel: load from disk in a new process %.3f ms (the engine's whole lookup %.3f ms)\n",
               r.load_ms, r.value / 1000.0);
    }

    const dg_jit_desc d = probe_desc(5);
    long (*fn)(long) = (long (*)(long))dg_jit_get(&d);
    TU_CHECK(fn && fn(1) == 8, "the probe in this process");
    enum { N = 200000 };
    double t0 = cpu_ms(), w0 = now_ms();
    long sum = 0;
    for (int i = 0; i < N; ++i)
        sum += dg_jit_get(&d) == (void *)fn;
    double t1 = cpu_ms(), w1 = now_ms();
    TU_CHECK(sum == N, "every lookup finds the loaded kernel");
    printf("in-process lookup: %.0f ns per dg_jit_get (CPU time; %.0f ns wall)\n", (t1 - t0) * 1e6 / N,
           (w1 - w0) * 1e6 / N);
    if (!avx2)
        return;
    dg_engine_set_jit(1);
    const dg_ukr_fn f = jit_small(4, 128, 302);
    t0 = cpu_ms(), w0 = now_ms();
    for (int i = 0; i < N; ++i)
        sum += jit_small(4, 128, 302) == f;
    t1 = cpu_ms(), w1 = now_ms();
    dg_engine_set_jit(-2);
    printf("in-process lookup: %.0f ns per engine kernel lookup (descriptor and dg_jit_get; CPU time; %.0f ns wall)\n",
           (t1 - t0) * 1e6 / N, (w1 - w0) * 1e6 / N);
}

/* ---- built-in against JIT on the small-M decoding shapes --------------------------------------- */

static int cmp_double(const void *x, const void *y) {
    const double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

static double proc_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

#if HAVE_AVX2_KERNELS
/* The microkernels alone on L1-resident panels (kc 128, ldc 16: the small-M path's calls). */
static void bench_ukr(int reps) {
    static const int kMr[4] = {1, 2, 4, 6};
    float *a = aligned_alloc(64, 6 * 128 * 4), *b = aligned_alloc(64, 16 * 128 * 4), c[6 * 16];
    tu_rng r = {3};
    tu_fill_normal(&r, a, 6 * 128, 1.0f);
    tu_fill_normal(&r, b, 16 * 128, 1.0f);
    dg_engine_set_jit(1);
    printf("microkernel, kc 128, L1-resident panels, thread CPU time per call: median (min) ns\n");
    for (int i = 0; i < 4; ++i) {
        const int mr = kMr[i];
        const dg_ukr_fn f[2] = {builtin_small(mr), jit_small(mr, 128, 7168)};
        if (!f[1]) {
            printf("MR %d: no JIT kernel\n", mr);
            continue;
        }
        double t[2][64];
        const int nr = reps < 64 ? reps : 64, calls = 20000;
        for (int rep = 0; rep < nr; ++rep)
            for (int w = 0; w < 2; ++w) {
                const int u = (rep & 1) ? 1 - w : w;
                const double t0 = cpu_ms();
                for (int q = 0; q < calls; ++q)
                    f[u](128, a, b, c, 16, q ? DG_UKR_ACC : DG_UKR_ZERO, NULL, NULL);
                t[u][rep] = (cpu_ms() - t0) * 1e6 / calls;
            }
        qsort(t[0], (size_t)nr, sizeof(double), cmp_double);
        qsort(t[1], (size_t)nr, sizeof(double), cmp_double);
        printf("MR %d: built-in %.1f (%.1f)  jit %.1f (%.1f)  jit/built-in %.3f\n", mr, t[0][nr / 2], t[0][0],
               t[1][nr / 2], t[1][0], t[1][nr / 2] / t[0][nr / 2]);
    }
    dg_engine_set_jit(-2);
    free(a);
    free(b);
}
#endif

static int bench(int reps) {
#if HAVE_AVX2_KERNELS
    bench_ukr(reps);
#endif
    static const int64_t kM[] = {16, 64};
    const int64_t n = 2112, k = 7168;
    tu_rng r = {5};
    top b = top_make(&r, DG_BFLOAT16, n, k, 0, 0, 0, 0, 0);
    printf("bf16 small-M GEMM, n %lld k %lld, %d threads, %d alternating reps: median (min) ms\n", (long long)n, (long long)k,
           dg_get_num_sms(), reps);
    for (size_t mi = 0; mi < 2; ++mi) {
        const int64_t m = kM[mi];
        top a = top_make(&r, DG_BFLOAT16, m, k, 0, 0, 0, 0, 0);
        dg_tensor d0 = tu_alloc2(DG_FLOAT32, m, n), d1 = tu_alloc2(DG_FLOAT32, m, n);
        double t[2][64], c[2][64];
        for (int w = 0; w < 2; ++w) { /* warm-up; the first JIT call compiles or loads */
            dg_engine_set_jit(w);
            dg_bf16_gemm_nt(&a.t, &b.t, w ? &d1 : &d0, NULL);
        }
        for (int i = 0; i < reps && i < 64; ++i)
            for (int w = 0; w < 2; ++w) {
                const int use = (i & 1) ? 1 - w : w; /* alternate the order */
                dg_engine_set_jit(use);
                const double t0 = now_ms(), c0 = proc_ms();
                dg_bf16_gemm_nt(&a.t, &b.t, use ? &d1 : &d0, NULL);
                t[use][i] = now_ms() - t0;
                c[use][i] = proc_ms() - c0;
            }
        const int nr = reps < 64 ? reps : 64;
        for (int w = 0; w < 2; ++w) {
            qsort(t[w], (size_t)nr, sizeof(double), cmp_double);
            qsort(c[w], (size_t)nr, sizeof(double), cmp_double);
        }
        printf("m%lld wall: built-in %.2f (%.2f)  jit %.2f (%.2f)  jit/built-in %.3f  same bits %s\n", (long long)m,
               t[0][nr / 2], t[0][0], t[1][nr / 2], t[1][0], t[1][nr / 2] / t[0][nr / 2],
               memcmp(d0.data, d1.data, (size_t)(m * n) * 4) ? "NO" : "yes");
        printf("m%lld CPU:  built-in %.2f (%.2f)  jit %.2f (%.2f)  jit/built-in %.3f\n", (long long)m, c[0][nr / 2],
               c[0][0], c[1][nr / 2], c[1][0], c[1][nr / 2] / c[0][nr / 2]);
        tu_free(&d0);
        tu_free(&d1);
        top_free(&a);
    }
    top_free(&b);
    dg_engine_set_jit(-2);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 2 && !strcmp(argv[1], "--child"))
        return child(argc, argv);
    if (argc > 1 && !strcmp(argv[1], "--bench"))
        return bench(argc > 2 ? atoi(argv[2]) : 11);
    const ssize_t n = readlink("/proc/self/exe", g_self, sizeof g_self - 1);
    if (n <= 0) {
        fprintf(stderr, "test_jit: cannot find this program (/proc/self/exe)\n");
        return 1;
    }
    g_self[n] = '\0';
    const char *tmp = getenv("TMPDIR");
    snprintf(g_root, sizeof g_root, "%s/dg-jit-test-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g_root)) {
        fprintf(stderr, "test_jit: mkdtemp %s: %s\n", g_root, strerror(errno));
        return 1;
    }
    char main_dir[300];
    snprintf(main_dir, sizeof main_dir, "%s/main", g_root);
    setenv("DG_JIT_CACHE_DIR", main_dir, 1); /* before the JIT reads its environment */
    const bool root = geteuid() == 0;
    dg_jit_set_source(PROBE_SOURCE, kProbe);
    char key[33];
    const dg_jit_desc d = probe_desc(1);
    if (dg_jit_mode() == 0 || !dg_jit_key(&d, key)) {
        printf("skip: %s; checking the fallback only\n",
               dg_jit_mode() == 0 ? "the JIT is off (DG_JIT=0, or built with -DDG_JIT=OFF)" : "no C compiler for the JIT");
        TU_CHECK(dg_jit_get(&d) == NULL, "dg_jit_get returns NULL");
        const kv env[] = {{"DG_JIT_CACHE_DIR", main_dir}};
        const result r = run_child("gemm", NULL, env, 1);
        TU_CHECK(r.ran && r.ok, "a GEMM with the JIT asked for gives the built-in bits");
    } else {
        const double t0 = now_ms();
        test_keys();
        dg_cpu_info cpu;
        const bool avx2 = HAVE_AVX2_KERNELS && dg_get_cpu_info(&cpu) == DG_OK && cpu.avx2 && cpu.fma;
        const dg_isa isa = dg_get_isa();
        if (avx2 && dg_set_isa(DG_ISA_AVX2) == DG_OK) {
            timings(true);
            test_kernels();
            test_gemms();
            dg_set_isa(isa);
        } else {
            printf("skip: no AVX2 here, the JIT's kernel family is AVX2's\n");
            timings(false);
        }
        test_cache(root);
        test_race();
        test_fallbacks(root);
        printf("test_jit: %.1f s\n", (now_ms() - t0) / 1e3);
    }
    chmod(g_root, 0700);
    char ro[300];
    snprintf(ro, sizeof ro, "%s/readonly", g_root);
    chmod(ro, 0700);
    rm_rf(g_root);
    return tu_finish();
}
