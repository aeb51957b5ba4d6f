/*
 * jit.c - the runtime JIT (jit.h): descriptors, the in-process table, the compiler, the disk
 * cache. Environment (read at first use and by dg_jit_reset):
 *   DG_JIT                         0 off, 1 on, unset: callers decide ("auto")
 *   DG_JIT_CC, CC                  the compiler (first set wins; else `cc` on PATH); words after
 *                                  the first are extra arguments
 *   DG_JIT_CACHE_DIR               ':'-separated directories: first valid entry wins, misses
 *                                  compile into the first; default $XDG_CACHE_HOME/deepgemm-cpu/jit
 *                                  or ~/.cache/deepgemm-cpu/jit (created 0700)
 *   DG_JIT_DEBUG                   descriptors, keys, loads, compiles, refusals and fallbacks
 *   DG_JIT_PRINT_COMPILER_COMMAND  the compiler's command lines
 *   DG_JIT_PRINT_LOAD_TIME         the time of each disk load or compile
 *   DG_JIT_DUMP_ASM                also writes the unit's assembly to <family>-<key>.s
 * Everything printed goes to stderr, prefixed "[deepgemm jit] ".
 *
 * A compile runs in a mkdtemp directory inside the target cache directory: the unit and the
 * embedded sources it includes are written there, the compiler runs through posix_spawn (no
 * shell), and the .so and its manifest are rename()d into place. Compiles into one directory
 * are serialized across processes by flock() on <dir>/.lock (a racer that waited finds the
 * entry and loads it); without the lock, rename keeps every reader safe anyway: an entry whose
 * manifest does not match its .so is refused and rebuilt. The .so that passed the checks is the
 * one loaded: after dlopen the path must still name the same inode, unchanged.
 */
#if !defined(_GNU_SOURCE)
#define _GNU_SOURCE
#endif
#include "jit.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation" /* messages and paths are cut on purpose */
#endif

#include <stdlib.h>
#include <string.h>

#if DG_HAVE_JIT

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <ftw.h>
#include <pthread.h>
#include <pwd.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

extern char **environ;

#define MAX_DIRS 8
#define MAX_CC_WORDS 16
#define MAX_OVERRIDES 16
#define TEXT_CAP 2048
#define BASE_FLAGS "-std=gnu11 -O3 -march=native -fPIC"
#define PREFIX "[deepgemm jit] "

/* ---- hashing: 64-bit lanes, murmur3's finalizer; not cryptographic (keys name files, the
 * ownership and permission checks are what protects loading) ---------------------------- */

typedef struct hasher {
    uint64_t a, b;
    uint64_t n;
    uint8_t buf[8];
    int nb;
} hasher;

static uint64_t fmix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static void h_init(hasher *h, uint64_t seed) {
    h->a = 0x9e3779b97f4a7c15ULL ^ seed;
    h->b = 0xc2b2ae3d27d4eb4fULL + seed;
    h->n = 0;
    h->nb = 0;
}

static void h_word(hasher *h, uint64_t w) {
    h->a = rotl64(h->a ^ (w * 0x87c37b91114253d5ULL), 31) * 0x4cf5ad432745937fULL;
    h->b = rotl64(h->b + w, 27) * 0x52dce729ULL + h->a;
}

static void h_update(hasher *h, const void *data, size_t len) {
    const uint8_t *p = data;
    h->n += len;
    while (len && h->nb) {
        h->buf[h->nb++] = *p++, --len;
        if (h->nb == 8) {
            uint64_t w;
            memcpy(&w, h->buf, 8);
            h_word(h, w);
            h->nb = 0;
        }
    }
    for (; len >= 8; p += 8, len -= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h_word(h, w);
    }
    while (len)
        h->buf[h->nb++] = *p++, --len;
}

static void h_str(hasher *h, const char *s) { h_update(h, s, strlen(s) + 1); } /* with the NUL: a boundary */

static void h_final(hasher *h, uint64_t out[2]) {
    uint64_t w = 0;
    memcpy(&w, h->buf, (size_t)h->nb);
    h_word(h, w ^ ((uint64_t)h->nb << 56));
    out[0] = fmix64(h->a ^ h->n);
    out[1] = fmix64(h->b ^ rotl64(out[0], 17) ^ h->n);
}

static uint64_t hash64(const void *data, size_t len, uint64_t seed) {
    hasher h;
    uint64_t out[2];
    h_init(&h, seed);
    h_update(&h, data, len);
    h_final(&h, out);
    return out[0];
}

/* ---- state ---------------------------------------------------------------------------------- */

typedef struct entry {
    struct entry *next;
    uint64_t hash;
    char *text;
    void *fn; /* NULL: failed (not retried until dg_jit_reset) */
} entry;

#define TABLE_BUCKETS 256

typedef struct override {
    char *name, *text;
} override;

enum { N_OFF = 1, N_NO_CC = 2, N_COMPILE = 4, N_DIR = 8, N_DESC = 16, N_SOURCE = 32, N_LOAD = 64 };

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;         /* table, env, stats, overrides */
static pthread_mutex_t g_compile_mu = PTHREAD_MUTEX_INITIALIZER; /* one miss at a time */
static atomic_int g_mode = -2;                                   /* -2: environment not read */
static bool g_inited;
static entry *g_table[TABLE_BUCKETS];
static override g_over[MAX_OVERRIDES];
static int g_nover;
static dg_jit_stats g_stats;
static unsigned g_noticed;

static struct {
    int debug, print_cmd, print_load, dump_asm;
    char *dirs[MAX_DIRS];
    int ndirs;
    char *cc_words[MAX_CC_WORDS]; /* [0] the resolved program, then the extra words */
    int ncc;
    char cc_ident[PATH_MAX + 96];
    char *cc_version; /* first line of `cc --version`, read once, when compiling */
    char host[512];
} E;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, PREFIX "%s\n", line);
}

/* A one-time notice of a fallback (under DG_JIT_DEBUG). g_mu held. */
static void notice_once(unsigned kind, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void notice_once(unsigned kind, const char *fmt, ...) {
    if (!E.debug || (g_noticed & kind))
        return;
    g_noticed |= kind;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, PREFIX "%s; the built-in kernels serve\n", line);
}

static int env_flag(const char *name) {
    const char *s = getenv(name);
    return s && *s && strcmp(s, "0") != 0;
}

static int parse_mode(const char *s) {
    if (!s || !*s || !strcmp(s, "auto"))
        return -1;
    if (!strcmp(s, "0") || !strcmp(s, "off") || !strcmp(s, "false") || !strcmp(s, "no"))
        return 0;
    return 1;
}

static bool mkdir_p(const char *path) {
    char buf[PATH_MAX];
    if (strlen(path) >= sizeof buf || !*path)
        return false;
    strcpy(buf, path);
    for (char *p = buf + 1;; ++p) {
        if (*p == '/' || *p == '\0') {
            const char c = *p;
            *p = '\0';
            if (mkdir(buf, 0700) != 0 && errno != EEXIST)
                return false;
            *p = c;
            if (!c)
                break;
        }
    }
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static void resolve_dirs(void) {
    const char *s = getenv("DG_JIT_CACHE_DIR");
    if (s && *s) {
        const char *p = s;
        while (*p && E.ndirs < MAX_DIRS) {
            const char *q = strchr(p, ':');
            const size_t n = q ? (size_t)(q - p) : strlen(p);
            if (n > 0 && n < PATH_MAX) {
                E.dirs[E.ndirs] = malloc(n + 1);
                if (E.dirs[E.ndirs]) {
                    memcpy(E.dirs[E.ndirs], p, n);
                    E.dirs[E.ndirs++][n] = '\0';
                }
            }
            p = q ? q + 1 : p + n;
        }
        return;
    }
    char buf[PATH_MAX];
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (!home || !*home) {
        const struct passwd *pw = getpwuid(geteuid());
        home = pw ? pw->pw_dir : NULL;
    }
    int n = -1;
    if (xdg && xdg[0] == '/')
        n = snprintf(buf, sizeof buf, "%s/deepgemm-cpu/jit", xdg);
    else if (home && *home)
        n = snprintf(buf, sizeof buf, "%s/.cache/deepgemm-cpu/jit", home);
    if (n > 0 && n < (int)sizeof buf && (E.dirs[0] = strdup(buf)))
        E.ndirs = 1;
}

/* DG_JIT_CC, then CC, then cc; a name without '/' is searched on PATH. */
static void resolve_compiler(void) {
    const char *v = getenv("DG_JIT_CC");
    if (!v || !*v)
        v = getenv("CC");
    if (!v || !*v)
        v = "cc";
    char *copy = strdup(v);
    if (!copy)
        return;
    char *words[MAX_CC_WORDS];
    int n = 0;
    for (char *save = NULL, *w = strtok_r(copy, " \t", &save); w && n < MAX_CC_WORDS; w = strtok_r(NULL, " \t", &save))
        words[n++] = w;
    char found[PATH_MAX] = "";
    if (n > 0 && strchr(words[0], '/')) {
        if (strlen(words[0]) < sizeof found)
            strcpy(found, words[0]);
    } else if (n > 0) {
        const char *path = getenv("PATH");
        if (!path)
            path = "/usr/local/bin:/usr/bin:/bin";
        for (const char *p = path; *p;) {
            const char *q = strchr(p, ':');
            const size_t len = q ? (size_t)(q - p) : strlen(p);
            char cand[PATH_MAX];
            struct stat st;
            if (snprintf(cand, sizeof cand, "%.*s/%s", (int)len, len ? p : ".", words[0]) < (int)sizeof cand &&
                stat(cand, &st) == 0 && S_ISREG(st.st_mode) && access(cand, X_OK) == 0) {
                strcpy(found, cand);
                break;
            }
            p = q ? q + 1 : p + len;
        }
    }
    char real[PATH_MAX];
    struct stat st;
    if (found[0] && realpath(found, real) && stat(real, &st) == 0 && S_ISREG(st.st_mode) && access(real, X_OK) == 0) {
        E.cc_words[0] = strdup(real);
        E.ncc = E.cc_words[0] ? 1 : 0;
        for (int i = 1; i < n && E.ncc; ++i)
            if ((E.cc_words[E.ncc] = strdup(words[i])))
                ++E.ncc;
        snprintf(E.cc_ident, sizeof E.cc_ident, "%s size=%lld mtime=%lld.%09ld", real, (long long)st.st_size,
                 (long long)st.st_mtim.tv_sec, (long)st.st_mtim.tv_nsec);
    }
    free(copy);
}

/* The host CPU: the code is compiled with -march=native, so a cache shared between machines
 * must not hand one CPU's code to another. */
static void resolve_host(void) {
    char *p = E.host;
    size_t left = sizeof E.host;
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d, max = __get_cpuid_max(0, NULL);
    char vendor[13] = "";
    if (max >= 1) {
        __cpuid(0, a, b, c, d);
        memcpy(vendor, &b, 4), memcpy(vendor + 4, &d, 4), memcpy(vendor + 8, &c, 4);
        __cpuid(1, a, b, c, d); /* b (APIC id) varies per core */
        int k = snprintf(p, left, "%s %08x %08x %08x", vendor, a, c, d);
        p += k, left -= (size_t)k;
    }
    if (max >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        int k = snprintf(p, left, " 7:%08x:%08x:%08x", b, c, d);
        p += k, left -= (size_t)k;
        __cpuid_count(7, 1, a, b, c, d);
        k = snprintf(p, left, " 7.1:%08x", a);
        p += k, left -= (size_t)k;
    }
    if ((unsigned)__get_cpuid_max(0x80000000u, NULL) >= 0x80000004u) {
        unsigned brand[12];
        for (unsigned i = 0; i < 3; ++i)
            __cpuid(0x80000002u + i, brand[4 * i], brand[4 * i + 1], brand[4 * i + 2], brand[4 * i + 3]);
        __cpuid(0x80000001u, a, b, c, d);
        snprintf(p, left, " ext:%08x:%08x %.48s", c, d, (const char *)brand);
    }
#else
    struct utsname u;
    if (uname(&u) == 0)
        snprintf(p, left, "%s", u.machine);
#endif
    (void)p, (void)left;
}

static void free_env(void) {
    for (int i = 0; i < E.ndirs; ++i)
        free(E.dirs[i]);
    for (int i = 0; i < E.ncc; ++i)
        free(E.cc_words[i]);
    free(E.cc_version);
    memset(&E, 0, sizeof E);
}

/* g_mu held. */
static void ensure_env(void) {
    if (g_inited)
        return;
    E.debug = env_flag("DG_JIT_DEBUG");
    E.print_cmd = E.debug || env_flag("DG_JIT_PRINT_COMPILER_COMMAND");
    E.print_load = E.debug || env_flag("DG_JIT_PRINT_LOAD_TIME");
    E.dump_asm = env_flag("DG_JIT_DUMP_ASM");
    resolve_dirs();
    resolve_compiler();
    resolve_host();
    atomic_store(&g_mode, parse_mode(getenv("DG_JIT")));
    g_inited = true;
}

int dg_jit_mode(void) {
    int m = atomic_load_explicit(&g_mode, memory_order_relaxed);
    if (m != -2)
        return m;
    pthread_mutex_lock(&g_mu);
    ensure_env();
    pthread_mutex_unlock(&g_mu);
    return atomic_load(&g_mode);
}

static void clear_table(void) {
    for (int i = 0; i < TABLE_BUCKETS; ++i) {
        for (entry *e = g_table[i], *n; e; e = n) {
            n = e->next;
            free(e->text);
            free(e);
        }
        g_table[i] = NULL;
    }
}

void dg_jit_reset(void) {
    pthread_mutex_lock(&g_compile_mu);
    pthread_mutex_lock(&g_mu);
    clear_table();
    free_env();
    g_inited = false;
    g_noticed = 0;
    memset(&g_stats, 0, sizeof g_stats);
    atomic_store(&g_mode, -2);
    pthread_mutex_unlock(&g_mu);
    pthread_mutex_unlock(&g_compile_mu);
}

void dg_jit_get_stats(dg_jit_stats *out) {
    pthread_mutex_lock(&g_mu);
    *out = g_stats;
    pthread_mutex_unlock(&g_mu);
}

/* ---- sources ------------------------------------------------------------------------------- */

/* g_mu held. */
static const char *source_locked(const char *name, size_t *len) {
    for (int i = 0; i < g_nover; ++i)
        if (!strcmp(g_over[i].name, name)) {
            *len = strlen(g_over[i].text);
            return g_over[i].text;
        }
    for (int i = 0; i < dg_jit_embedded_count; ++i)
        if (!strcmp(dg_jit_embedded_sources[i].name, name)) {
            *len = dg_jit_embedded_sources[i].len;
            return (const char *)dg_jit_embedded_sources[i].text;
        }
    return NULL;
}

const char *dg_jit_source(const char *name, size_t *len) {
    size_t n = 0;
    pthread_mutex_lock(&g_mu);
    const char *s = name ? source_locked(name, &n) : NULL;
    pthread_mutex_unlock(&g_mu);
    if (len)
        *len = n;
    return s;
}

void dg_jit_set_source(const char *name, const char *text) {
    pthread_mutex_lock(&g_compile_mu);
    pthread_mutex_lock(&g_mu);
    int i = 0;
    while (i < g_nover && strcmp(g_over[i].name, name))
        ++i;
    if (i < g_nover) { /* replace or remove */
        free(g_over[i].text);
        if (text) {
            g_over[i].text = strdup(text);
        } else {
            free(g_over[i].name);
            g_over[i] = g_over[--g_nover];
        }
    } else if (text && g_nover < MAX_OVERRIDES) {
        g_over[g_nover].name = strdup(name);
        g_over[g_nover].text = strdup(text);
        ++g_nover;
    }
    clear_table();
    pthread_mutex_unlock(&g_mu);
    pthread_mutex_unlock(&g_compile_mu);
}

/* ---- descriptors ----------------------------------------------------------------------------- */

static bool is_ident(const char *s) {
    if (!s || !*s || (*s >= '0' && *s <= '9'))
        return false;
    for (; *s; ++s)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_'))
            return false;
    return true;
}

static bool is_source_name(const char *s) {
    if (!s || !*s || *s == '/' || strstr(s, ".."))
        return false;
    for (; *s; ++s)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_' ||
              *s == '.' || *s == '/' || *s == '-'))
            return false;
    return true;
}

static bool desc_valid(const dg_jit_desc *d) {
    if (!d || !is_ident(d->family) || !is_ident(d->symbol) || d->nconsts < 0 || d->nconsts > DG_JIT_MAX_CONSTS ||
        d->nsources < 1 || d->nsources > DG_JIT_MAX_SOURCES)
        return false;
    for (int i = 0; i < d->nconsts; ++i)
        if (!is_ident(d->consts[i].name))
            return false;
    for (int i = 0; i < d->nsources; ++i)
        if (!is_source_name(d->sources[i]))
            return false;
    return !d->flags || (!strchr(d->flags, '\n') && !strchr(d->flags, '\r'));
}

typedef struct sbuf {
    char *p;
    size_t size, len;
} sbuf;

/* A byte loop: the pieces are short, and calls of strlen and memcpy per piece cost more (the
 * descriptor's text is rendered on every lookup). */
static void put_s(sbuf *b, const char *s) {
    char *p = b->p + b->len;
    const char *end = b->len + 1 < b->size ? b->p + b->size - 1 : p;
    size_t n = 0;
    for (; s[n] && p < end; ++n)
        *p++ = s[n];
    while (s[n])
        ++n;
    b->len += n;
}

static void put_i(sbuf *b, int64_t v) {
    char tmp[24];
    int n = 0;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    do
        tmp[n++] = (char)('0' + u % 10);
    while (u /= 10);
    if (v < 0)
        tmp[n++] = '-';
    char out[24];
    for (int i = 0; i < n; ++i)
        out[i] = tmp[n - 1 - i];
    out[n] = '\0';
    put_s(b, out);
}

size_t dg_jit_desc_text(const dg_jit_desc *d, char *buf, size_t size) {
    sbuf b = {buf, size, 0};
    put_s(&b, "family=");
    put_s(&b, d->family ? d->family : "?");
    put_s(&b, " symbol=");
    put_s(&b, d->symbol ? d->symbol : "?");
    put_s(&b, " consts=");
    for (int i = 0; i < d->nconsts && i < DG_JIT_MAX_CONSTS; ++i) {
        if (i)
            put_s(&b, ",");
        put_s(&b, d->consts[i].name ? d->consts[i].name : "?");
        put_s(&b, "=");
        put_i(&b, d->consts[i].value);
    }
    put_s(&b, " sources=");
    for (int i = 0; i < d->nsources && i < DG_JIT_MAX_SOURCES; ++i) {
        if (i)
            put_s(&b, ",");
        put_s(&b, d->sources[i] ? d->sources[i] : "?");
    }
    put_s(&b, " flags=");
    put_s(&b, d->flags ? d->flags : "");
    if (size)
        buf[b.len < size ? b.len : size - 1] = '\0';
    return b.len;
}

/* g_mu held. False: no compiler, or a source is not embedded (*missing gets its name). */
static bool key_locked(const dg_jit_desc *d, const char *text, char key[33], const char **missing) {
    *missing = NULL;
    if (!E.ncc)
        return false;
    hasher h;
    h_init(&h, 0x6a09e667f3bcc908ULL);
    h_str(&h, "deepgemm-cpu jit 1");
    h_str(&h, text);
    h_str(&h, E.cc_ident);
    for (int i = 1; i < E.ncc; ++i)
        h_str(&h, E.cc_words[i]);
    h_str(&h, BASE_FLAGS);
    h_str(&h, E.host);
    for (int i = 0; i < d->nsources; ++i) {
        size_t len;
        if (!source_locked(d->sources[i], &len)) {
            *missing = d->sources[i];
            return false;
        }
    }
    /* every embedded source (as overridden), not only those the unit names: they may include
     * each other, and a key must change with any text the compiler could read; then the
     * unit's sources that are not embedded (test overrides) */
    for (int i = 0; i < dg_jit_embedded_count + d->nsources; ++i) {
        const char *name = i < dg_jit_embedded_count ? dg_jit_embedded_sources[i].name
                                                     : d->sources[i - dg_jit_embedded_count];
        size_t len;
        const char *s = source_locked(name, &len);
        h_str(&h, name);
        h_update(&h, &len, sizeof len);
        h_update(&h, s, len);
    }
    uint64_t out[2];
    h_final(&h, out);
    snprintf(key, 33, "%016llx%016llx", (unsigned long long)out[0], (unsigned long long)out[1]);
    return true;
}

bool dg_jit_key(const dg_jit_desc *d, char key[33]) {
    char text[TEXT_CAP];
    if (!desc_valid(d) || dg_jit_desc_text(d, text, sizeof text) >= sizeof text)
        return false;
    const char *missing;
    pthread_mutex_lock(&g_mu);
    ensure_env();
    const bool ok = key_locked(d, text, key, &missing);
    pthread_mutex_unlock(&g_mu);
    return ok;
}

/* ---- files ----------------------------------------------------------------------------------- */

static bool write_file(const char *path, const void *data, size_t len, mode_t mode) {
    const int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
    if (fd < 0)
        return false;
    const char *p = data;
    bool ok = true;
    while (len && ok) {
        const ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR)
            continue;
        ok = w > 0;
        if (ok)
            p += w, len -= (size_t)w;
    }
    return close(fd) == 0 && ok;
}

/* Reads all of fd (at most cap bytes) into a malloc'd buffer. */
static char *read_fd(int fd, size_t cap, size_t *len) {
    size_t n = 0, size = 4096;
    char *buf = malloc(size + 1);
    while (buf) {
        if (n == size) {
            if (size >= cap) {
                free(buf);
                return NULL;
            }
            size *= 2;
            char *nb = realloc(buf, size + 1);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
        }
        const ssize_t r = read(fd, buf + n, size - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            free(buf);
            return NULL;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    if (buf)
        buf[n] = '\0';
    *len = n;
    return buf;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

static void rm_tree(const char *path) { nftw(path, rm_one, 8, FTW_DEPTH | FTW_PHYS); }

/* A cache directory entries may be loaded from and compiled into: ours (or root's) and not
 * writable by others unless sticky (then others cannot replace our files). */
static const char *dir_unsafe(const char *dir) {
    struct stat st;
    if (stat(dir, &st) != 0)
        return "does not exist";
    if (!S_ISDIR(st.st_mode))
        return "is not a directory";
    if (st.st_uid != geteuid() && st.st_uid != 0)
        return "is owned by another user";
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX))
        return "is writable by group or others";
    return NULL;
}

/* An entry file opened for checking: a regular file (not a link) owned by us, not writable by
 * group or others. Returns the fd or -1 with *why set (*why NULL: the file does not exist). */
static int open_checked(const char *path, struct stat *st, const char **why) {
    *why = NULL;
    const int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        if (errno != ENOENT)
            *why = errno == ELOOP ? "is a symbolic link" : "cannot be opened";
        return -1;
    }
    if (fstat(fd, st) != 0)
        *why = "cannot be examined";
    else if (!S_ISREG(st->st_mode))
        *why = "is not a regular file";
    else if (st->st_uid != geteuid())
        *why = "is owned by another user";
    else if (st->st_mode & (S_IWGRP | S_IWOTH))
        *why = "is writable by group or others";
    if (*why) {
        close(fd);
        return -1;
    }
    return fd;
}

typedef struct manifest {
    char key[33];
    long long size;
    unsigned long long sum;
} manifest;

static bool parse_manifest(const char *text, manifest *m) {
    memset(m, 0, sizeof *m);
    m->size = -1;
    bool have_sum = false;
    for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (!strncmp(l, "key ", 4))
            sscanf(l + 4, "%32s", m->key);
        else if (!strncmp(l, "size ", 5))
            sscanf(l + 5, "%lld", &m->size);
        else if (!strncmp(l, "checksum ", 9))
            have_sum = sscanf(l + 9, "%16llx", &m->sum) == 1;
    }
    return m->key[0] && m->size >= 0 && have_sum;
}

#define SO_CAP ((size_t)64 << 20)

enum { LOAD_OK, LOAD_MISSING, LOAD_REFUSED };

/* Checks <dir>/<name>.so against its manifest; LOAD_OK loads it (*fn the symbol, *handle). */
static int try_load(const char *dir, const char *name, const char *key, const char *symbol, bool load, void **fn,
                    char *why, size_t whysz) {
    char so[PATH_MAX], man[PATH_MAX];
    snprintf(so, sizeof so, "%s/%s.so", dir, name);
    snprintf(man, sizeof man, "%s/%s.manifest", dir, name);
    struct stat st, mst;
    const char *w;
    const int fd = open_checked(so, &st, &w);
    if (fd < 0) {
        if (!w)
            return LOAD_MISSING;
        snprintf(why, whysz, "%s %s", so, w);
        return LOAD_REFUSED;
    }
    int result = LOAD_REFUSED;
    char *mtext = NULL, *data = NULL;
    const int mfd = open_checked(man, &mst, &w);
    manifest m;
    size_t mlen = 0, len = 0;
    if (mfd < 0) {
        snprintf(why, whysz, "%s %s", man, w ? w : "is missing");
        goto out;
    }
    mtext = read_fd(mfd, 1 << 16, &mlen);
    close(mfd);
    if (!mtext || !parse_manifest(mtext, &m) || strcmp(m.key, key) != 0) {
        snprintf(why, whysz, "%s is not this entry's manifest", man);
        goto out;
    }
    if ((long long)st.st_size != m.size) {
        snprintf(why, whysz, "%s has %lld bytes, its manifest says %lld (truncated?)", so, (long long)st.st_size,
                 m.size);
        goto out;
    }
    data = read_fd(fd, SO_CAP, &len);
    if (!data || (long long)len != m.size || hash64(data, len, 0x5851f42d4c957f2dULL) != m.sum) {
        snprintf(why, whysz, "%s does not match its manifest's checksum", so);
        goto out;
    }
    result = LOAD_OK;
    if (!load)
        goto out;
    void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(why, whysz, "dlopen %s: %s", so, e ? e : "failed");
        result = LOAD_REFUSED;
        goto out;
    }
    struct stat after;
    if (lstat(so, &after) != 0 || after.st_dev != st.st_dev || after.st_ino != st.st_ino ||
        after.st_size != st.st_size || after.st_mtim.tv_sec != st.st_mtim.tv_sec ||
        after.st_mtim.tv_nsec != st.st_mtim.tv_nsec || after.st_ctim.tv_sec != st.st_ctim.tv_sec ||
        after.st_ctim.tv_nsec != st.st_ctim.tv_nsec) {
        /* replaced between the checks and dlopen: what was loaded is not what was checked
         * (dlopen's name matching may also have returned an object loaded earlier) */
        snprintf(why, whysz, "%s changed while it was loaded", so);
        dlclose(h);
        result = LOAD_REFUSED;
        goto out;
    }
    *fn = dlsym(h, symbol);
    if (!*fn) { /* keep h: a handle costs nothing and closing one that others share is not ours */
        snprintf(why, whysz, "%s has no symbol %s", so, symbol);
        result = LOAD_REFUSED;
    }
out:
    free(mtext);
    free(data);
    close(fd);
    return result;
}

/* ---- the compiler ---------------------------------------------------------------------------- */

/* Runs argv (argv[0] = the program) with stdout and stderr into log; the exit status (-1: not
 * run). */
static int run(char *const argv[], const char *log) {
    if (E.print_cmd) {
        char line[4096];
        sbuf b = {line, sizeof line, 0};
        for (int i = 0; argv[i]; ++i) {
            if (i)
                put_s(&b, " ");
            put_s(&b, argv[i]);
        }
        line[b.len < sizeof line ? b.len : sizeof line - 1] = '\0';
        say("running: %s", line);
    }
    posix_spawn_file_actions_t fa;
    if (posix_spawn_file_actions_init(&fa) != 0)
        return -1;
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    const int err = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (err != 0)
        return -1;
    int status = 0;
    for (;;) {
        if (waitpid(pid, &status, 0) == pid)
            break;
        if (errno == EINTR)
            continue;
        return errno == ECHILD ? 0 : -1; /* SIGCHLD ignored by the program: judged by the output */
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static char *read_path(const char *path, size_t cap) {
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    size_t len;
    char *s = read_fd(fd, cap, &len);
    close(fd);
    return s;
}

/* The compiler's first --version line, once per process (only when compiling). g_compile_mu held. */
static const char *cc_version(const char *tmp) {
    if (E.cc_version)
        return E.cc_version;
    char log[PATH_MAX];
    snprintf(log, sizeof log, "%s/version", tmp);
    char *argv[] = {E.cc_words[0], "--version", NULL};
    char *out = run(argv, log) == 0 ? read_path(log, 1 << 16) : NULL;
    if (out) {
        out[strcspn(out, "\n")] = '\0';
        E.cc_version = out;
    } else {
        E.cc_version = strdup("unknown");
    }
    unlink(log);
    return E.cc_version ? E.cc_version : "unknown";
}

/* Writes the unit and its sources into tmp. g_mu held (sources). */
static bool write_unit(const char *tmp, const dg_jit_desc *d, const char *text) {
    char path[PATH_MAX], unit[8192];
    sbuf b = {unit, sizeof unit, 0};
    put_s(&b, "/* deepgemm-cpu JIT unit: ");
    put_s(&b, text);
    put_s(&b, " */\n#define DG_JIT_SYMBOL ");
    put_s(&b, d->symbol);
    put_s(&b, "\n");
    for (int i = 0; i < d->nconsts; ++i) {
        put_s(&b, "#define ");
        put_s(&b, d->consts[i].name);
        put_s(&b, d->consts[i].value < 0 ? " (" : " ");
        put_i(&b, d->consts[i].value);
        put_s(&b, d->consts[i].value < 0 ? ")\n" : "\n");
    }
    for (int i = 0; i < d->nsources; ++i) {
        put_s(&b, "#include \"");
        put_s(&b, d->sources[i]);
        put_s(&b, "\"\n");
    }
    if (b.len >= sizeof unit)
        return false;
    snprintf(path, sizeof path, "%s/kernel.c", tmp);
    if (!write_file(path, unit, b.len, 0600))
        return false;
    /* every embedded source and override: a source may include another */
    for (int i = 0; i < dg_jit_embedded_count + g_nover; ++i) {
        const char *name =
            i < dg_jit_embedded_count ? dg_jit_embedded_sources[i].name : g_over[i - dg_jit_embedded_count].name;
        size_t len;
        const char *s = source_locked(name, &len);
        if (!is_source_name(name) || snprintf(path, sizeof path, "%s/%s", tmp, name) >= (int)sizeof path)
            return false;
        char *slash = strrchr(path, '/');
        *slash = '\0';
        if (!mkdir_p(path))
            return false;
        *slash = '/';
        if (access(path, F_OK) == 0) /* an override of an embedded source, written already */
            continue;
        if (!write_file(path, s, len, 0600))
            return false;
    }
    return true;
}

/* First lines of the compiler's log, for the notice. */
static void log_excerpt(const char *log, char *out, size_t size) {
    char *s = read_path(log, 1 << 20);
    out[0] = '\0';
    if (!s)
        return;
    size_t n = 0;
    int lines = 0;
    for (const char *p = s; *p && lines < 12 && n + 1 < size; ++p) {
        out[n++] = *p;
        if (*p == '\n')
            ++lines;
    }
    out[n] = '\0';
    free(s);
}

enum { BUILD_FAILED, BUILD_COMPILED, BUILD_FOUND };

/* Compiles d into <dir>/<name>.so (+ .manifest, .s); BUILD_FOUND: another process made the
 * entry while this one waited for the lock. g_compile_mu held, not g_mu. */
static int compile_entry(const char *dir, const char *name, const char *key, const dg_jit_desc *d, const char *text,
                          char *why, size_t whysz) {
    char tmp[PATH_MAX], so[PATH_MAX], out[PATH_MAX], log[PATH_MAX], src[PATH_MAX], inc[PATH_MAX];
    if (!mkdir_p(dir)) {
        snprintf(why, whysz, "cache directory %s cannot be created", dir);
        return BUILD_FAILED;
    }
    const char *unsafe = dir_unsafe(dir);
    if (unsafe) {
        snprintf(why, whysz, "cache directory %s %s", dir, unsafe);
        return BUILD_FAILED;
    }
    snprintf(tmp, sizeof tmp, "%s/.lock", dir);
    const int lock = open(tmp, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (lock >= 0)
        while (flock(lock, LOCK_EX) != 0 && errno == EINTR) {
        }
    void *unused = NULL;
    char w2[256];
    if (try_load(dir, name, key, d->symbol, false, &unused, w2, sizeof w2) == LOAD_OK) { /* a racer made it */
        if (lock >= 0)
            close(lock);
        return BUILD_FOUND;
    }
    bool ok = false;
    if (snprintf(tmp, sizeof tmp, "%s/.tmp-%s-XXXXXX", dir, d->family) >= (int)sizeof tmp || !mkdtemp(tmp)) {
        snprintf(why, whysz, "cache directory %s is not writable (%s)", dir, strerror(errno));
        if (lock >= 0)
            close(lock);
        return BUILD_FAILED;
    }
    pthread_mutex_lock(&g_mu);
    const bool written = write_unit(tmp, d, text);
    pthread_mutex_unlock(&g_mu);
    if (!written) {
        snprintf(why, whysz, "cannot write the unit into %s", tmp);
        goto done;
    }
    snprintf(so, sizeof so, "%s/kernel.so", tmp);
    snprintf(log, sizeof log, "%s/log", tmp);
    snprintf(src, sizeof src, "%s/kernel.c", tmp);
    snprintf(inc, sizeof inc, "-I%s", tmp);
    char *flags = strdup(BASE_FLAGS " -shared");
    char *extra = strdup(d->flags ? d->flags : "");
    char *argv[64];
    int n = 0;
    if (!flags || !extra) {
        free(flags);
        free(extra);
        snprintf(why, whysz, "out of memory");
        goto done;
    }
    for (int i = 0; i < E.ncc; ++i)
        argv[n++] = E.cc_words[i];
    for (char *s = NULL, *t = strtok_r(flags, " ", &s); t; t = strtok_r(NULL, " ", &s))
        argv[n++] = t;
    for (char *s = NULL, *t = strtok_r(extra, " \t", &s); t && n < 52; t = strtok_r(NULL, " \t", &s))
        argv[n++] = t;
    argv[n++] = inc;
    argv[n++] = "-o";
    const int at_out = n;
    argv[n++] = so;
    argv[n++] = src;
    argv[n] = NULL;
    const double t0 = now_ms();
    const int rc = run(argv, log);
    struct stat st;
    if (rc != 0 || stat(so, &st) != 0 || st.st_size == 0) {
        char excerpt[1024];
        log_excerpt(log, excerpt, sizeof excerpt);
        snprintf(why, whysz, "%s %s%s%s", E.cc_words[0],
                 rc < 0 ? "could not be run" : "failed to compile the unit", excerpt[0] ? ":\n" : "", excerpt);
        free(flags);
        free(extra);
        goto done;
    }
    if (E.dump_asm) { /* the same command with -S instead of -shared */
        snprintf(out, sizeof out, "%s/kernel.s", tmp);
        for (int i = 0; i < n; ++i)
            if (argv[i] && !strcmp(argv[i], "-shared"))
                argv[i] = "-S";
        argv[at_out] = out;
        if (run(argv, log) != 0 && E.debug)
            say("DG_JIT_DUMP_ASM: %s -S failed (the kernel is used anyway)", E.cc_words[0]);
    }
    free(flags);
    free(extra);
    const char *version = cc_version(tmp);
    chmod(so, 0755);
    const int fd = open(so, O_RDONLY | O_CLOEXEC);
    size_t len = 0;
    char *data = fd >= 0 ? read_fd(fd, SO_CAP, &len) : NULL;
    if (fd >= 0)
        close(fd);
    if (!data) {
        snprintf(why, whysz, "cannot read back %s", so);
        goto done;
    }
    char mtext[PATH_MAX + 2048];
    const int mlen = snprintf(mtext, sizeof mtext,
                              "deepgemm-cpu jit manifest 1\nkey %s\nsize %lld\nchecksum %016llx\ncompiler %s\n"
                              "version %s\ndesc %s\n",
                              key, (long long)len, (unsigned long long)hash64(data, len, 0x5851f42d4c957f2dULL),
                              E.cc_ident, version, text);
    free(data);
    char man[PATH_MAX], dst[PATH_MAX];
    snprintf(man, sizeof man, "%s/manifest", tmp);
    if (mlen <= 0 || mlen >= (int)sizeof mtext || !write_file(man, mtext, (size_t)mlen, 0644)) {
        snprintf(why, whysz, "cannot write %s", man);
        goto done;
    }
    snprintf(dst, sizeof dst, "%s/%s.so", dir, name);
    if (rename(so, dst) != 0) {
        snprintf(why, whysz, "cannot rename the object to %s (%s)", dst, strerror(errno));
        goto done;
    }
    snprintf(dst, sizeof dst, "%s/%s.manifest", dir, name);
    if (rename(man, dst) != 0) {
        snprintf(why, whysz, "cannot rename the manifest to %s (%s)", dst, strerror(errno));
        goto done;
    }
    if (E.dump_asm && access(out, F_OK) == 0) {
        snprintf(dst, sizeof dst, "%s/%s.s", dir, name);
        rename(out, dst);
    }
    ok = true;
    if (E.print_load)
        say("compiled %s/%s.so in %.1f ms (%s)", dir, name, now_ms() - t0, version);
done:
    rm_tree(tmp);
    if (lock >= 0)
        close(lock);
    return ok ? BUILD_COMPILED : BUILD_FAILED;
}

/* ---- lookup ---------------------------------------------------------------------------------- */

/* g_mu held. */
static entry *find(uint64_t h, const char *text) {
    for (entry *e = g_table[h % TABLE_BUCKETS]; e; e = e->next)
        if (e->hash == h && !strcmp(e->text, text))
            return e;
    return NULL;
}

/* g_mu held. */
static void insert(uint64_t h, const char *text, void *fn) {
    entry *e = malloc(sizeof *e);
    if (!e)
        return;
    e->text = strdup(text);
    if (!e->text) {
        free(e);
        return;
    }
    e->hash = h, e->fn = fn;
    e->next = g_table[h % TABLE_BUCKETS];
    g_table[h % TABLE_BUCKETS] = e;
}

/* A table miss: load from a cache directory or compile. g_compile_mu held, not g_mu. */
static void *resolve(const dg_jit_desc *d, const char *text) {
    char key[33], name[128], why[2048];
    const char *missing = NULL;
    pthread_mutex_lock(&g_mu);
    const bool have_key = key_locked(d, text, key, &missing);
    if (!have_key) {
        if (missing)
            notice_once(N_SOURCE, "source %s is not embedded in this build (%s)", missing, text);
        else
            notice_once(N_NO_CC, "no C compiler (DG_JIT_CC, CC, cc on PATH)");
    }
    const int ndirs = E.ndirs;
    if (have_key && !ndirs)
        notice_once(N_DIR, "no cache directory (set DG_JIT_CACHE_DIR or HOME)");
    pthread_mutex_unlock(&g_mu);
    if (!have_key || !ndirs)
        return NULL;
    snprintf(name, sizeof name, "%s-%s", d->family, key);
    if (E.debug)
        say("%s key=%s", text, key);
    void *fn = NULL;
    const double t0 = now_ms();
    for (int i = 0; i < ndirs && !fn; ++i) {
        const char *unsafe = dir_unsafe(E.dirs[i]);
        if (unsafe) {
            if (E.debug && strcmp(unsafe, "does not exist") != 0)
                say("cache directory %s %s: not used", E.dirs[i], unsafe);
            continue;
        }
        const int r = try_load(E.dirs[i], name, key, d->symbol, true, &fn, why, sizeof why);
        if (r == LOAD_OK) {
            const double ms = now_ms() - t0;
            pthread_mutex_lock(&g_mu);
            ++g_stats.disk_loads;
            g_stats.last_load_ms = ms;
            pthread_mutex_unlock(&g_mu);
            if (E.print_load)
                say("loaded %s/%s.so in %.3f ms", E.dirs[i], name, ms);
            return fn;
        }
        fn = NULL;
        if (r == LOAD_REFUSED) {
            pthread_mutex_lock(&g_mu);
            ++g_stats.rebuilds;
            pthread_mutex_unlock(&g_mu);
            if (E.debug)
                say("not loaded, rebuilding: %s", why);
        }
    }
    const int built = compile_entry(E.dirs[0], name, key, d, text, why, sizeof why);
    if (built == BUILD_FAILED) {
        pthread_mutex_lock(&g_mu);
        if (strstr(why, "cache directory"))
            notice_once(N_DIR, "%s", why);
        else
            notice_once(N_COMPILE, "%s", why);
        pthread_mutex_unlock(&g_mu);
        return NULL;
    }
    const int r = try_load(E.dirs[0], name, key, d->symbol, true, &fn, why, sizeof why);
    const double ms = now_ms() - t0;
    pthread_mutex_lock(&g_mu);
    if (r == LOAD_OK && built == BUILD_COMPILED) {
        ++g_stats.compiles;
        g_stats.last_compile_ms = ms;
    } else if (r == LOAD_OK) { /* another process compiled it */
        ++g_stats.disk_loads;
        g_stats.last_load_ms = ms;
    } else {
        fn = NULL;
        notice_once(N_LOAD, "a freshly compiled entry was not loaded: %s", why);
    }
    pthread_mutex_unlock(&g_mu);
    return fn;
}

void *dg_jit_get(const dg_jit_desc *d) {
    if (dg_jit_mode() == 0) {
        pthread_mutex_lock(&g_mu);
        ++g_stats.lookups, ++g_stats.failures;
        notice_once(N_OFF, "off (DG_JIT=0)");
        pthread_mutex_unlock(&g_mu);
        return NULL;
    }
    /* The fast path renders and hashes the text only: a malformed descriptor (checked on a
     * miss) cannot render the text of a valid one (names are identifiers, "?" stands for NULL). */
    char text[TEXT_CAP];
    const size_t len = d ? dg_jit_desc_text(d, text, sizeof text) : sizeof text;
    const uint64_t h = len < sizeof text ? hash64(text, len, 0) : 0;
    pthread_mutex_lock(&g_mu);
    ++g_stats.lookups;
    entry *e = len < sizeof text ? find(h, text) : NULL;
    if (e) {
        void *fn = e->fn;
        g_stats.failures += !fn;
        pthread_mutex_unlock(&g_mu);
        return fn;
    }
    if (len >= sizeof text || !desc_valid(d)) {
        ++g_stats.failures;
        notice_once(N_DESC, "a malformed descriptor");
        pthread_mutex_unlock(&g_mu);
        return NULL;
    }
    pthread_mutex_unlock(&g_mu);

    pthread_mutex_lock(&g_compile_mu);
    pthread_mutex_lock(&g_mu);
    e = find(h, text); /* another thread resolved it meanwhile */
    void *fn = e ? e->fn : NULL;
    pthread_mutex_unlock(&g_mu);
    if (!e) {
        fn = resolve(d, text);
        pthread_mutex_lock(&g_mu);
        insert(h, text, fn);
        pthread_mutex_unlock(&g_mu);
    }
    pthread_mutex_unlock(&g_compile_mu);
    if (!fn) {
        pthread_mutex_lock(&g_mu);
        ++g_stats.failures;
        pthread_mutex_unlock(&g_mu);
    }
    return fn;
}

#else /* !DG_HAVE_JIT: built without the JIT (CMake -DDG_JIT=OFF) */

const dg_jit_embedded dg_jit_embedded_sources[1];
const int dg_jit_embedded_count = 0;

size_t dg_jit_desc_text(const dg_jit_desc *d, char *buf, size_t size) {
    (void)d;
    if (size)
        buf[0] = '\0';
    return 0;
}
void *dg_jit_get(const dg_jit_desc *d) {
    (void)d;
    return NULL;
}
int dg_jit_mode(void) { return 0; }
bool dg_jit_key(const dg_jit_desc *d, char key[33]) {
    (void)d;
    key[0] = '\0';
    return false;
}
const char *dg_jit_source(const char *name, size_t *len) {
    (void)name;
    if (len)
        *len = 0;
    return NULL;
}
void dg_jit_set_source(const char *name, const char *text) { (void)name, (void)text; }
void dg_jit_reset(void) {}
void dg_jit_get_stats(dg_jit_stats *out) { memset(out, 0, sizeof *out); }

#endif
