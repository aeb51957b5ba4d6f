/*
 * jit.h - the runtime JIT: compiles a kernel's source with the system C compiler, caches the
 * shared object on disk and loads it (README, "Runtime JIT"). This layer knows nothing about
 * GEMMs: a caller describes a translation unit, gets a function pointer or NULL, and on NULL
 * runs its built-in kernel (which must compute the same bits: the same source, the same order).
 *
 * ---- The translation unit a descriptor names -----------------------------------------------
 *     #define DG_JIT_SYMBOL <symbol>
 *     #define <NAME> <VALUE>          for every constant, in order
 *     #include "<source>"             for every source, in order
 * Sources are paths under src/ ("kernels/avx2/ukr_f32_avx2.h") whose full text CMake embeds in
 * the library at build time (cmake/dg_jit_embed.cmake): the JIT writes them beside the unit and
 * compiles with -I there, so it needs no installed source tree, and a changed header changes
 * the key. A source may include system headers and other embedded sources only.
 *
 * ---- Cache key and entries -------------------------------------------------------------------
 * key = 128-bit hash of: the canonical text (dg_jit_desc_text, printed under DG_JIT_DEBUG), the
 * compiler's identity (its realpath, size and mtime), the full flags, the host CPU (CPUID: the
 * code is compiled with -march=native) and the name and text of every embedded source.
 * Entries are <dir>/<family>-<key>.so and .manifest (size and 64-bit checksum of the .so, the
 * compiler's --version line); DG_JIT_DUMP_ASM adds <family>-<key>.s. An entry is loaded only
 * when both files are regular files owned by geteuid() and not writable by group or others, and
 * the .so's size and checksum match the manifest; anything else is rebuilt.
 *
 * Thread-safe. Lookups of a loaded kernel take a mutex and hash the canonical text (well under
 * 1 us); the first lookup of a key loads from disk or compiles (compiles are serialized within
 * a process and, through a lock file per cache directory, across processes).
 */
#ifndef DG_JIT_JIT_H
#define DG_JIT_JIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DG_JIT_MAX_CONSTS 16
#define DG_JIT_MAX_SOURCES 8

typedef struct dg_jit_const {
    const char *name; /* a C identifier */
    int64_t value;
} dg_jit_const;

typedef struct dg_jit_desc {
    const char *family;  /* [A-Za-z0-9_]: names the cache entry ("ukr_f32_avx2") */
    const char *symbol;  /* the function the unit defines (a C identifier) */
    int nconsts;
    dg_jit_const consts[DG_JIT_MAX_CONSTS];
    int nsources;
    const char *sources[DG_JIT_MAX_SOURCES]; /* embedded sources, #included in order */
    const char *flags;   /* extra compiler flags, space-separated ("-mavx2 -mfma"), or NULL */
} dg_jit_desc;

/* The canonical text of d into buf (NUL-terminated, truncated to size); returns the length the
 * whole text needs (snprintf's rule). */
size_t dg_jit_desc_text(const dg_jit_desc *d, char *buf, size_t size);

/* The compiled function for d, or NULL: the JIT is off (DG_JIT=0, or built without it), there is
 * no compiler, the unit does not compile, no cache directory is writable, a source is not
 * embedded or d is malformed. The reason is printed once per process under DG_JIT_DEBUG. */
void *dg_jit_get(const dg_jit_desc *d);

/* DG_JIT: 0 off, 1 on, -1 not set ("auto": callers use the JIT where it was measured faster).
 * Built without the JIT (CMake option DG_JIT=OFF): always 0. */
int dg_jit_mode(void);

/* The cache key of d (32 hex digits); false when there is no compiler or a source is missing. */
bool dg_jit_key(const dg_jit_desc *d, char key[33]);

/* An embedded source's text (NULL when not embedded); *len gets its length. */
const char *dg_jit_source(const char *name, size_t *len);

/* Tests: replaces a source's text (or adds one) for this process, or restores the embedded text
 * when text is NULL; forgets the in-process table (loaded objects stay loaded). */
void dg_jit_set_source(const char *name, const char *text);

/* Tests: forgets the in-process table and the one-time notices and reads the environment again. */
void dg_jit_reset(void);

/* Counters since the process started (or dg_jit_reset), for tests and DG_JIT_PRINT_LOAD_TIME. */
typedef struct dg_jit_stats {
    long lookups;      /* dg_jit_get calls */
    long disk_loads;   /* entries loaded from a cache directory */
    long compiles;     /* successful compiles */
    long rebuilds;     /* entries found but refused (truncated, foreign, writable by others) */
    long failures;     /* dg_jit_get calls that returned NULL */
    double last_load_ms, last_compile_ms; /* of the latest disk load / compile (and load) */
} dg_jit_stats;
void dg_jit_get_stats(dg_jit_stats *out);

/* The embedded sources: generated at build time (cmake/dg_jit_embed.cmake) from DG_JIT_SOURCES
 * in CMakeLists.txt; text[len] is a NUL. */
typedef struct dg_jit_embedded {
    const char *name;
    const unsigned char *text;
    size_t len;
} dg_jit_embedded;
extern const dg_jit_embedded dg_jit_embedded_sources[];
extern const int dg_jit_embedded_count;

#endif /* DG_JIT_JIT_H */
