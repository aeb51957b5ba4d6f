/*
 * dgbench_peer.c - oneDNN, OpenBLAS and MKL timed on a case's inputs (see dgbench_peer.h).
 *
 * All are reached through dlopen/dlsym with prototypes declared here, so no header or
 * library of theirs is needed at build time. oneDNN 2.x and 3.x share every name, enum value
 * and argument index used below except how memory / operation descriptors are made: 2.x
 * fills caller-owned structs (dnnl_memory_desc_init_*, dnnl_matmul_desc_init +
 * dnnl_primitive_desc_create), 3.x returns handles (dnnl_memory_desc_create_*,
 * dnnl_matmul_primitive_desc_create). Both are passed around as `const void *`.
 *
 * A peer computes in BF16 where it can (oneDNN's BF16 matmul, MKL's cblas_gemm_bf16bf16f32),
 * or in FP32 for FLOAT32 cases. Inputs it cannot take as they are (FP8 / FP4 codes, or BF16
 * for a oneDNN without a BF16 matmul on this CPU, such as 3.2 on AVX2) are converted by a
 * plain C loop in the timed part ("+dequant" / "+widen"); pre-packed B is converted once.
 */
#define _GNU_SOURCE /* RTLD_DEFAULT, RTLD_NOLOAD, popen */
#include "dgbench_peer.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LOAD(lib, fp, name) (*(void **)&(fp) = dlsym((lib), (name)))

enum { PEER_ONEDNN = 0, PEER_OPENBLAS = 1, PEER_MKL = 2 };

/* ---- oneDNN ---- */

typedef int dnnl_status; /* 0: success */
typedef struct { int arg; void *memory; } dnnl_exec_arg;
typedef struct { int major, minor, patch; const char *hash; unsigned cpu_runtime, gpu_runtime; } dnnl_ver;
enum {
    DNNL_CPU = 1, DNNL_BF16 = 2, DNNL_F32 = 3, DNNL_TAG_ANY = 1, DNNL_QUERY_WEIGHTS_MD = 131,
    DNNL_ARG_SRC = 1, DNNL_ARG_DST = 17, DNNL_ARG_WEIGHTS = 33, DNNL_STREAM_IN_ORDER = 1,
    DNNL_RUNTIME_OMP = 2, DNNL_RUNTIME_TBB = 4,
    DNNL_V2_DESC_BYTES = 16384 /* > sizeof(dnnl_matmul_desc_t) (2800 in 2.6) */
};

typedef struct onednn {
    void *lib, *engine, *stream;
    int major;
    unsigned runtime;
    char version[48], file[256];
    dnnl_status (*engine_create)(void **, int, size_t);
    dnnl_status (*stream_create)(void **, void *, unsigned);
    dnnl_status (*stream_wait)(void *);
    dnnl_status (*memory_create)(void **, const void *, void *, void *);
    dnnl_status (*memory_set_data_handle)(void *, void *);
    dnnl_status (*memory_destroy)(void *);
    dnnl_status (*primitive_create)(void **, const void *);
    dnnl_status (*primitive_execute)(const void *, void *, int, const dnnl_exec_arg *);
    dnnl_status (*primitive_destroy)(void *);
    dnnl_status (*pd_destroy)(void *);
    const void *(*pd_query_md)(const void *, int, int);
    size_t (*md_get_size)(const void *);
    dnnl_status (*reorder_pd_create)(void **, const void *, void *, const void *, void *, const void *);
    /* 2.x */
    dnnl_status (*md_init_by_strides)(void *, int, const int64_t *, int, const int64_t *);
    dnnl_status (*md_init_by_tag)(void *, int, const int64_t *, int, int);
    dnnl_status (*matmul_desc_init)(void *, const void *, const void *, const void *, const void *);
    dnnl_status (*pd_create)(void **, const void *, const void *, void *, const void *);
    /* 3.x */
    dnnl_status (*md_create_with_strides)(void **, int, const int64_t *, int, const int64_t *);
    dnnl_status (*md_create_with_tag)(void **, int, const int64_t *, int, int);
    dnnl_status (*md_destroy)(void *);
    dnnl_status (*matmul_pd_create)(void **, void *, const void *, const void *, const void *, const void *,
                                    const void *);
} onednn;

/* ---- CBLAS (row-major), shared by OpenBLAS and MKL (LP64: int indices) ---- */

enum { CBLAS_ROW_MAJOR = 101, CBLAS_NO_TRANS = 111, CBLAS_TRANS = 112, CBLAS_PACKED = 151, CBLAS_B_MATRIX = 162 };
typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int, float,
                         float *, int);
typedef void (*bf16gemm_fn)(int, int, int, int, int, int, float, const uint16_t *, int, const uint16_t *, int,
                            float, float *, int);
typedef struct openblas {
    void *lib;
    char version[32], file[256];
    sgemm_fn sgemm;
    bf16gemm_fn sbgemm;
} openblas;

/* MKL through its single dynamic library mkl_rt (MKL_ENABLE_INSTRUCTIONS, MKL_THREADING_LAYER
 * and MKL_NUM_THREADS are MKL's own environment variables, read by it). */
enum { MKL_THREADING_GNU = 3, MKL_INTERFACE_LP64 = 0 };
typedef struct mkl {
    void *lib;
    char version[32], file[256], layer[16];
    sgemm_fn sgemm;
    bf16gemm_fn gemm_bf16; /* cblas_gemm_bf16bf16f32 */
    size_t (*bf16_pack_size)(int, int, int, int);
    void (*bf16_pack)(int, int, int, int, int, int, const uint16_t *, int, uint16_t *);
    bf16gemm_fn bf16_compute; /* cblas_gemm_bf16bf16f32_compute (TransB = CBLAS_PACKED) */
    size_t (*s_pack_size)(int, int, int, int);
    void (*s_pack)(int, int, int, int, int, int, float, const float *, int, float *);
    void (*s_compute)(int, int, int, int, int, int, const float *, int, const float *, int, float, float *, int);
} mkl;

static onednn g_dnnl;
static openblas g_blas;
static mkl g_mkl;
static int g_inited, g_threads;
static char g_isa_cap[96]; /* what bench_peers_init capped the peers to (empty: nothing) */
/* Why a library named by its variable, or found, is not used (empty: not found at all). */
static char g_why_dnnl[160], g_why_blas[160], g_why_mkl[160];

/* ---- finding a library: $ENV, the system's search path, then Python environments ---- */

/* dlopen(dir/name), loading (globally) from `dir` any dependency the loader cannot find:
 * PyPI wheels put their libraries and those they depend on in one lib directory that the
 * loader does not search (oneDNN's TBB / SYCL runtimes, MKL's OpenMP runtime). */
static char g_dlerr[256]; /* why the last open_in_dir failed */

static void *open_in_dir(const char *dir, const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s%s%s", dir ? dir : "", dir ? "/" : "", name);
    snprintf(g_dlerr, sizeof g_dlerr, "no such file");
    if (dir && access(path, R_OK) != 0)
        return NULL;
    for (int tries = 0; tries < 16; ++tries) {
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        const char *err = h ? NULL : dlerror();
        if (err)
            snprintf(g_dlerr, sizeof g_dlerr, "%s", err);
        if (h || !dir)
            return h;
        /* "libtbb.so.12: cannot open shared object file: ..." -> load dir/libtbb.so.12 first */
        const char *colon = err ? strstr(err, ": cannot open shared object") : NULL;
        if (!colon)
            return NULL;
        const char *start = colon;
        while (start > err && start[-1] != ' ' && start[-1] != '/')
            --start;
        char dep[512];
        snprintf(dep, sizeof dep, "%s/%.*s", dir, (int)(colon - start), start);
        if (access(dep, R_OK) != 0 || !dlopen(dep, RTLD_NOW | RTLD_GLOBAL))
            return NULL;
    }
    return NULL;
}

/* The lib directories of Python environments, where `pip install onednn-cpu-gomp mkl` puts the
 * libraries: $VIRTUAL_ENV, $CONDA_PREFIX, the prefixes of the python3 on PATH (sys.prefix,
 * sys.base_prefix, the user base of `pip install --user`), /usr/local. Asked of python3 once. */
static int python_lib_dirs(char dirs[][256], int max) {
    static char found[8][256];
    static int nfound = -1;
    if (nfound < 0) {
        nfound = 0;
        const char *envs[] = {getenv("VIRTUAL_ENV"), getenv("CONDA_PREFIX")};
        for (int i = 0; i < 2; ++i)
            if (envs[i] && *envs[i])
                snprintf(found[nfound++], 256, "%s/lib", envs[i]);
        FILE *p = popen("python3 -c 'import sys, site; print(sys.prefix); print(sys.base_prefix); "
                        "print(site.getuserbase())' 2>/dev/null",
                        "r");
        char line[240];
        while (p && nfound < 7 && fgets(line, sizeof line, p)) {
            line[strcspn(line, "\n")] = 0;
            if (*line)
                snprintf(found[nfound++], 256, "%s/lib", line);
        }
        if (p)
            pclose(p);
        snprintf(found[nfound++], 256, "/usr/local/lib");
    }
    int n = 0;
    for (int i = 0; i < nfound && n < max; ++i) {
        int dup = 0;
        for (int j = 0; j < n; ++j)
            dup |= !strcmp(dirs[j], found[i]);
        if (!dup)
            snprintf(dirs[n++], 256, "%.255s", found[i]);
    }
    return n;
}

/* $env names a file: only that. Else each name through the loader's search path, then in each
 * Python lib directory. `file` gets the path loaded (the bare name when the loader found it). */
static void *open_first(const char *env, const char *const *names, char *file, size_t file_size,
                        char *why) {
    const char *path = getenv(env);
    if (path && *path) {
        char dir[512];
        const char *slash = strrchr(path, '/');
        snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
        snprintf(file, file_size, "%s", path);
        void *h = slash ? open_in_dir(dir, slash + 1) : open_in_dir(NULL, path); /* a bare name: the loader's search */
        if (!h)
            snprintf(why, 160, "%s=%.60s not loaded: %.80s", env, path, g_dlerr);
        return h;
    }
    for (const char *const *n = names; *n; ++n) {
        void *h = open_in_dir(NULL, *n);
        if (h) {
            snprintf(file, file_size, "%s", *n);
            return h;
        }
    }
    char dirs[8][256];
    const int nd = python_lib_dirs(dirs, 8);
    for (int d = 0; d < nd; ++d)
        for (const char *const *n = names; *n; ++n) {
            void *h = open_in_dir(dirs[d], *n);
            if (h) {
                snprintf(file, file_size, "%.200s/%.50s", dirs[d], *n);
                return h;
            }
        }
    return NULL;
}

static int onednn_load(onednn *d) {
    static const char *const names[] = {"libdnnl.so.3", "libdnnl.so.2", NULL};
    d->lib = open_first("DGBENCH_ONEDNN", names, d->file, sizeof d->file, g_why_dnnl);
    if (!d->lib)
        return -1;
    const dnnl_ver *(*version)(void);
    LOAD(d->lib, version, "dnnl_version");
    if (!version) {
        snprintf(g_why_dnnl, sizeof g_why_dnnl, "%.60s has no dnnl_version", d->file);
        return -1;
    }
    const dnnl_ver *v = version();
    d->major = v->major, d->runtime = v->cpu_runtime;
    snprintf(d->version, sizeof d->version, "%d.%d.%d", v->major, v->minor, v->patch);
    int ok = LOAD(d->lib, d->engine_create, "dnnl_engine_create") &&
             LOAD(d->lib, d->stream_create, "dnnl_stream_create") &&
             LOAD(d->lib, d->stream_wait, "dnnl_stream_wait") &&
             LOAD(d->lib, d->memory_create, "dnnl_memory_create") &&
             LOAD(d->lib, d->memory_set_data_handle, "dnnl_memory_set_data_handle") &&
             LOAD(d->lib, d->memory_destroy, "dnnl_memory_destroy") &&
             LOAD(d->lib, d->primitive_create, "dnnl_primitive_create") &&
             LOAD(d->lib, d->primitive_execute, "dnnl_primitive_execute") &&
             LOAD(d->lib, d->primitive_destroy, "dnnl_primitive_destroy") &&
             LOAD(d->lib, d->pd_destroy, "dnnl_primitive_desc_destroy") &&
             LOAD(d->lib, d->pd_query_md, "dnnl_primitive_desc_query_md") &&
             LOAD(d->lib, d->md_get_size, "dnnl_memory_desc_get_size") &&
             LOAD(d->lib, d->reorder_pd_create, "dnnl_reorder_primitive_desc_create");
    if (d->major >= 3)
        ok = ok && LOAD(d->lib, d->md_create_with_strides, "dnnl_memory_desc_create_with_strides") &&
             LOAD(d->lib, d->md_create_with_tag, "dnnl_memory_desc_create_with_tag") &&
             LOAD(d->lib, d->md_destroy, "dnnl_memory_desc_destroy") &&
             LOAD(d->lib, d->matmul_pd_create, "dnnl_matmul_primitive_desc_create");
    else
        ok = ok && LOAD(d->lib, d->md_init_by_strides, "dnnl_memory_desc_init_by_strides") &&
             LOAD(d->lib, d->md_init_by_tag, "dnnl_memory_desc_init_by_tag") &&
             LOAD(d->lib, d->matmul_desc_init, "dnnl_matmul_desc_init") &&
             LOAD(d->lib, d->pd_create, "dnnl_primitive_desc_create");
    if (!ok || d->engine_create(&d->engine, DNNL_CPU, 0) != 0 ||
        d->stream_create(&d->stream, d->engine, DNNL_STREAM_IN_ORDER) != 0) {
        /* e.g. PyPI's `onednn` (a SYCL build): no CPU engine without a SYCL CPU device */
        snprintf(g_why_dnnl, sizeof g_why_dnnl, "onednn %.16s (%.60s) unusable: %s", d->version, d->file,
                 ok ? "no CPU engine (a SYCL build? use onednn-cpu-gomp)" : "missing functions");
        return -1;
    }
    /* Its OpenMP runtime is a dependency of the library: reach it through the handle. */
    void (*omp_threads)(int);
    if (LOAD(d->lib, omp_threads, "omp_set_num_threads"))
        omp_threads(g_threads);
    return 0;
}

static int openblas_load(openblas *b) {
    static const char *const names[] = {"libopenblas.so.0", "libopenblas.so", NULL};
    b->lib = open_first("DGBENCH_OPENBLAS", names, b->file, sizeof b->file, g_why_blas);
    if (!b->lib)
        return -1;
    char *(*config)(void);
    void (*set_threads)(int);
    LOAD(b->lib, config, "openblas_get_config");
    LOAD(b->lib, set_threads, "openblas_set_num_threads");
    LOAD(b->lib, b->sgemm, "cblas_sgemm");
    LOAD(b->lib, b->sbgemm, "cblas_sbgemm");
    if (!b->sgemm && !b->sbgemm) {
        snprintf(g_why_blas, sizeof g_why_blas, "%.60s has no cblas_sgemm", b->file);
        return -1;
    }
    if (set_threads)
        set_threads(g_threads);
    /* "OpenBLAS 0.3.21 NO_AFFINITY ..." -> "0.3.21" */
    const char *c = config ? config() : NULL, *sp = c ? strchr(c, ' ') : NULL;
    snprintf(b->version, sizeof b->version, "%.*s", sp ? (int)strcspn(sp + 1, " ") : 1, sp ? sp + 1 : "?");
    return 0;
}

static int mkl_load(mkl *k) {
    static const char *const names[] = {"libmkl_rt.so.3", "libmkl_rt.so.2", "libmkl_rt.so", NULL};
    k->lib = open_first("DGBENCH_MKL", names, k->file, sizeof k->file, g_why_mkl);
    if (!k->lib)
        return -1;
    int (*set_layer)(int), (*set_interface)(int);
    void (*set_threads)(int), (*version)(char *, int);
    LOAD(k->lib, set_layer, "MKL_Set_Threading_Layer");
    LOAD(k->lib, set_interface, "MKL_Set_Interface_Layer");
    LOAD(k->lib, set_threads, "MKL_Set_Num_Threads");
    LOAD(k->lib, version, "MKL_Get_Version_String");
    LOAD(k->lib, k->sgemm, "cblas_sgemm");
    LOAD(k->lib, k->gemm_bf16, "cblas_gemm_bf16bf16f32");
    LOAD(k->lib, k->bf16_pack_size, "cblas_gemm_bf16bf16f32_pack_get_size");
    LOAD(k->lib, k->bf16_pack, "cblas_gemm_bf16bf16f32_pack");
    LOAD(k->lib, k->bf16_compute, "cblas_gemm_bf16bf16f32_compute");
    LOAD(k->lib, k->s_pack_size, "cblas_sgemm_pack_get_size");
    LOAD(k->lib, k->s_pack, "cblas_sgemm_pack");
    LOAD(k->lib, k->s_compute, "cblas_sgemm_compute");
    if (!k->sgemm && !k->gemm_bf16) {
        snprintf(g_why_mkl, sizeof g_why_mkl, "%.60s has no cblas_sgemm", k->file);
        return -1;
    }
    /* Before any other MKL call: LP64 indices (our prototypes), and MKL's GNU OpenMP layer unless
     * MKL_THREADING_LAYER says otherwise, so that MKL and oneDNN share one OpenMP runtime (a second
     * one's threads would keep spinning on the two cores while the next library runs). */
    if (set_interface)
        set_interface(MKL_INTERFACE_LP64);
    const char *layer = getenv("MKL_THREADING_LAYER");
    if (layer && *layer)
        snprintf(k->layer, sizeof k->layer, "%s", layer);
    else if (set_layer && set_layer(MKL_THREADING_GNU) >= 0)
        snprintf(k->layer, sizeof k->layer, "GNU");
    if (set_threads)
        set_threads(g_threads);
    char v[256] = "";
    if (version)
        version(v, (int)sizeof v);
    /* "Intel(R) oneAPI Math Kernel Library Version 2026.2-Product Build ..." -> "2026.2" */
    const char *at = strstr(v, "Version ");
    snprintf(k->version, sizeof k->version, "%.*s", at ? (int)strcspn(at + 8, "- ") : 1, at ? at + 8 : "?");
    return 0;
}

/* When DG_ISA caps the library below this CPU's best level, cap the peers to the same level
 * (ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS; both read by the libraries at their first
 * use) unless those variables are set already. */
static void cap_peer_isa(void) {
    dg_cpu_info ci;
    const dg_isa isa = dg_get_isa();
    if (dg_get_cpu_info(&ci) != DG_OK || isa >= ci.best_isa)
        return;
    static const char *const dnnl_isa[] = {"SSE41", "AVX2", "AVX512_CORE", "AVX512_CORE_BF16", "AVX512_CORE_AMX"};
    static const char *const mkl_isa[] = {"SSE4_2", "AVX2", "AVX512", "AVX512_E3", "AVX512_E4"};
    const int i = (int)isa;
    setenv("ONEDNN_MAX_CPU_ISA", dnnl_isa[i], 0);
    setenv("DNNL_MAX_CPU_ISA", dnnl_isa[i], 0); /* oneDNN 2.x */
    setenv("MKL_ENABLE_INSTRUCTIONS", mkl_isa[i], 0);
    snprintf(g_isa_cap, sizeof g_isa_cap, "ONEDNN_MAX_CPU_ISA=%s MKL_ENABLE_INSTRUCTIONS=%s",
             getenv("ONEDNN_MAX_CPU_ISA"), getenv("MKL_ENABLE_INSTRUCTIONS"));
}

void bench_peers_init(FILE *f) {
    if (g_inited)
        return;
    g_inited = 1;
    g_threads = dg_get_num_sms();
    cap_peer_isa();
    const int have_dnnl = onednn_load(&g_dnnl) == 0, have_blas = openblas_load(&g_blas) == 0,
              have_mkl = mkl_load(&g_mkl) == 0;
    if (!have_dnnl)
        g_dnnl.major = 0;
    if (!have_blas)
        g_blas.sgemm = NULL, g_blas.sbgemm = NULL;
    if (!have_mkl)
        g_mkl.sgemm = NULL, g_mkl.gemm_bf16 = NULL;
    if (!have_dnnl && !have_blas && !have_mkl) {
        fprintf(f, "\npeers: none found%s%s%s%s%s%s (looked for oneDNN libdnnl.so.3 / .so.2, OpenBLAS libopenblas.so.0 "
                   "and MKL libmkl_rt.so.3 / .so.2 on the loader's path and in Python's lib directories); "
                   "`pip install onednn-cpu-gomp mkl` or `apt-get install libdnnl-dev libopenblas-dev` adds "
                   "them, or set DGBENCH_ONEDNN / DGBENCH_OPENBLAS / DGBENCH_MKL to a library file\n",
                g_why_dnnl[0] ? "; " : "", g_why_dnnl, g_why_mkl[0] ? "; " : "", g_why_mkl,
                g_why_blas[0] ? "; " : "", g_why_blas);
        return;
    }
    fprintf(f, "\npeers (%d threads%s%s): ", g_threads, g_isa_cap[0] ? "; " : "", g_isa_cap);
    if (have_dnnl)
        fprintf(f, "onednn %s (%s%s)", g_dnnl.version, g_dnnl.file,
                g_dnnl.runtime == DNNL_RUNTIME_OMP   ? ""
                : g_dnnl.runtime == DNNL_RUNTIME_TBB ? "; TBB threads: all cores"
                                                     : "; its own threads");
    else
        fprintf(f, "%s", g_why_dnnl[0] ? g_why_dnnl : "onednn not found (pip install onednn-cpu-gomp, or DGBENCH_ONEDNN=file)");
    if (have_mkl) {
        const char *mi = g_isa_cap[0] ? NULL : getenv("MKL_ENABLE_INSTRUCTIONS"); /* else shown above */
        fprintf(f, ", mkl %s (%s; %s threads%s%s)", g_mkl.version, g_mkl.file,
                g_mkl.layer[0] ? g_mkl.layer : "default", mi && *mi ? "; MKL_ENABLE_INSTRUCTIONS=" : "",
                mi && *mi ? mi : "");
    } else
        fprintf(f, ", %s", g_why_mkl[0] ? g_why_mkl : "mkl not found (pip install mkl, or DGBENCH_MKL=file)");
    if (have_blas)
        fprintf(f, ", openblas %s (%s%s)", g_blas.version, g_blas.file,
                g_blas.sbgemm ? "" : "; no cblas_sbgemm: BF16 cases not compared");
    else
        fprintf(f, ", %s", g_why_blas[0] ? g_why_blas : "openblas not found (apt-get install libopenblas-dev, or DGBENCH_OPENBLAS=file)");
    fputc('\n', f);
}

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; ++s)
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s >= 0x20)
            fputc(*s, f);
    fputc('"', f);
}

void bench_peers_json(FILE *f) {
    fprintf(f, "{\"onednn\": ");
    if (g_dnnl.major) {
        fprintf(f, "{\"version\": \"%s\", \"file\": ", g_dnnl.version);
        json_str(f, g_dnnl.file);
        fprintf(f, "}");
    } else
        fprintf(f, "null");
    fprintf(f, ", \"mkl\": ");
    if (g_mkl.sgemm || g_mkl.gemm_bf16) {
        const char *mi = getenv("MKL_ENABLE_INSTRUCTIONS");
        fprintf(f, "{\"version\": \"%s\", \"file\": ", g_mkl.version);
        json_str(f, g_mkl.file);
        fprintf(f, ", \"threading_layer\": ");
        json_str(f, g_mkl.layer);
        fprintf(f, ", \"enable_instructions\": ");
        json_str(f, mi ? mi : "");
        fprintf(f, "}");
    } else
        fprintf(f, "null");
    fprintf(f, ", \"openblas\": ");
    if (g_blas.sgemm || g_blas.sbgemm) {
        fprintf(f, "{\"version\": \"%s\", \"file\": ", g_blas.version);
        json_str(f, g_blas.file);
        fprintf(f, ", \"sbgemm\": %s}", g_blas.sbgemm ? "true" : "false");
    } else
        fprintf(f, "null");
    fprintf(f, "}");
}

/* ---- conversion to the peer's input type: the plain loop a user would write ---- */

static uint16_t to_bf16(float x) { /* round to nearest even; inputs here are finite */
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static float scale_at(const dg_tensor *sf, int64_t i, int64_t j) {
    if (sf->dtype == DG_INT32) { /* packed UE8M0: four exponent bytes per word, little-endian */
        const uint32_t w = ((const uint32_t *)sf->data)[i * sf->strides[0] + (j / 4) * sf->strides[1]];
        return dg_ue8m0_to_float((uint8_t)(w >> (8 * (j % 4))));
    }
    return ((const float *)sf->data)[i * sf->strides[0] + j * sf->strides[1]];
}

static int quantized(const bench_peer_operand *op) {
    return op->t->dtype == DG_FLOAT8_E4M3 || op->t->dtype == DG_FP4_E2M1X2;
}

/* t (the operand op, or one of its copies) -> `out` in dtype ct (BFLOAT16 or FLOAT32), dense:
 * FP8 / FP4 codes [rows, K] (K-major) dequantized with their scales to [rows, K]; BF16 widened
 * element by element in its stored order ([rows, K], or [K, rows] when MN-major). */
static void convert(const bench_peer_operand *op, const dg_tensor *t, int64_t rows, int64_t k, void *out,
                    dg_dtype ct) {
    uint16_t *o16 = out;
    float *o32 = out;
    if (!quantized(op)) { /* BF16 -> FLOAT32 */
        const int64_t s0 = t->shape[0], s1 = t->shape[1];
        for (int64_t i = 0; i < s0; ++i) {
            const uint16_t *row = (const uint16_t *)t->data + i * t->strides[0];
            for (int64_t j = 0; j < s1; ++j)
            {
                const uint32_t u = (uint32_t)row[j * t->strides[1]] << 16;
                memcpy(&o32[i * s1 + j], &u, 4);
            }
        }
        return;
    }
    static float lut8[256], lut4[16];
    if (lut8[0x38] == 0) { /* 0x38 is 1.0 in E4M3 */
        for (int i = 0; i < 256; ++i)
            lut8[i] = dg_e4m3_to_float((uint8_t)i);
        for (int i = 0; i < 16; ++i)
            lut4[i] = dg_e2m1_to_float((uint8_t)i);
    }
    const int fp4 = t->dtype == DG_FP4_E2M1X2, f32 = ct == DG_FLOAT32;
    const uint8_t *q = t->data;
    for (int64_t r = 0; r < rows; ++r) {
        const uint8_t *row = q + r * t->strides[0];
        for (int64_t k0 = 0; k0 < k; k0 += op->gran_k) {
            const float s = scale_at(op->sf, r / op->gran_mn, k0 / op->gran_k);
            const int64_t k1 = k0 + op->gran_k < k ? k0 + op->gran_k : k;
            for (int64_t j = k0; j < k1; ++j) {
                const float x = (fp4 ? lut4[(row[j / 2] >> (4 * (j & 1))) & 15] : lut8[row[j]]) * s;
                if (f32)
                    o32[r * k + j] = x;
                else
                    o16[r * k + j] = to_bf16(x);
            }
        }
    }
}

/* ---- one peer variant on one case ---- */

typedef struct md { /* 2.x: the struct itself in v2 (696 bytes in 2.6); 3.x: the handle in h */
    void *h;
    int64_t v2[512];
} md;

typedef struct peer_run {
    const bench_peer_gemm *g;
    int lib;                /* PEER_ONEDNN, PEER_OPENBLAS, PEER_MKL */
    dg_dtype ct;            /* the peer's input dtype: BFLOAT16 or FLOAT32 */
    int conv_a, conv_b;     /* A / B converted to ct: A in every run; B in every run when its codes
                               are dequantized, else (widened BF16) once per copy at setup */
    int d_f32;              /* the peer writes FLOAT32 D */
    md mda, mdb, mdd, mdu;  /* oneDNN: src, weights (as the matmul takes it), dst, user weights */
    void *pd, *prim, *mem_a, *mem_b, *mem_d;
    void **packed;          /* pre-packed weights copies */
    int npacked, next;
    void *ac, *bc;          /* converted A and B */
    void **bw;              /* B widened once, one per copy (nbw = nb) */
    int nbw;
    const void *b_now;      /* B of this run as the peer reads it */
    void *d;                /* peer's D */
    double dequant_s;
} peer_run;

static size_t ct_size(dg_dtype ct) { return ct == DG_FLOAT32 ? 4 : 2; }

/* The operand as the peer reads it: the stored tensor, or its converted copy (dense, in the
 * stored order; [rows, K] for dequantized codes). Gives data, the row length of the storage
 * (CBLAS ld) and whether it is stored [K, rows]. */
static const void *operand(const peer_run *p, const bench_peer_operand *op, const dg_tensor *t, int conv,
                           void *copy, int64_t rows, int64_t *ld, int *mn_stored) {
    const int q = quantized(op);
    *mn_stored = !q && op->mn_major; /* stored [K, rows]: CBLAS transposes it the other way */
    if (!conv) {
        *ld = t->strides[0]; /* rows of the stored matrix are dense (checked by the caller) */
        return t->data;
    }
    *ld = q || !op->mn_major ? p->g->k : rows;
    return copy;
}

/* Strides of the logical [rows, K] operand as oneDNN's [K, rows] weights (transposed view). */
static void kn_strides(const bench_peer_operand *op, const dg_tensor *t, int conv, int64_t k, int64_t rows,
                       int64_t out[2]) {
    if (conv) { /* dense copy in the stored order */
        const int mn = !quantized(op) && op->mn_major;
        out[0] = mn ? rows : 1, out[1] = mn ? 1 : k;
        return;
    }
    const int64_t s0 = t->strides[0], s1 = t->strides[1];
    out[0] = op->mn_major ? s0 : s1; /* step along K */
    out[1] = op->mn_major ? s1 : s0; /* step along rows */
}

static int md_make(md *m, int64_t r, int64_t c, int dt, const int64_t *strides) {
    const int64_t dims[12] = {r, c}, st[12] = {strides ? strides[0] : 0, strides ? strides[1] : 0};
    if (g_dnnl.major >= 3)
        return strides ? g_dnnl.md_create_with_strides(&m->h, 2, dims, dt, st)
                       : g_dnnl.md_create_with_tag(&m->h, 2, dims, dt, DNNL_TAG_ANY);
    m->h = m->v2;
    return strides ? g_dnnl.md_init_by_strides(m->h, 2, dims, dt, st)
                   : g_dnnl.md_init_by_tag(m->h, 2, dims, dt, DNNL_TAG_ANY);
}

static void md_drop(md *m) {
    if (g_dnnl.major >= 3 && m->h)
        g_dnnl.md_destroy(m->h);
    m->h = NULL;
}

static int matmul_pd(peer_run *p) {
    if (g_dnnl.major >= 3)
        return g_dnnl.matmul_pd_create(&p->pd, g_dnnl.engine, p->mda.h, p->mdb.h, NULL, p->mdd.h, NULL);
    void *desc = calloc(1, DNNL_V2_DESC_BYTES);
    int st = !desc || g_dnnl.matmul_desc_init(desc, p->mda.h, p->mdb.h, NULL, p->mdd.h) != 0 ||
             g_dnnl.pd_create(&p->pd, desc, NULL, g_dnnl.engine, NULL) != 0;
    free(desc);
    return st;
}

static int dnnl_dt(dg_dtype t) { return t == DG_FLOAT32 ? DNNL_F32 : DNNL_BF16; }

/* B once in the peer's input type (converted when it must be), for pre-packing. The caller
 * frees *tmp. */
static const void *b_once(peer_run *p, void **tmp) {
    const bench_peer_gemm *g = p->g;
    *tmp = NULL;
    if (!p->conv_b)
        return g->b.t[0].data;
    *tmp = bench_alloc_uninit((size_t)(g->n * g->k) * ct_size(p->ct));
    if (*tmp)
        convert(&g->b, &g->b.t[0], g->n, g->k, *tmp, p->ct);
    return *tmp;
}

/* Pre-packed weights: reorder B (converted first when it must be) into p->npacked copies. */
static int dnnl_prepack(peer_run *p, const int64_t bst[2]) {
    const bench_peer_gemm *g = p->g;
    const void *wmd = g_dnnl.pd_query_md(p->pd, DNNL_QUERY_WEIGHTS_MD, 0);
    const size_t bytes = wmd ? g_dnnl.md_get_size(wmd) : 0;
    void *rpd = NULL, *rprim = NULL, *src = NULL, *tmp;
    const void *b_data = b_once(p, &tmp);
    int rc = !b_data || bytes == 0 || md_make(&p->mdu, g->k, g->n, dnnl_dt(p->ct), bst) ||
             g_dnnl.reorder_pd_create(&rpd, p->mdu.h, g_dnnl.engine, wmd, g_dnnl.engine, NULL) ||
             g_dnnl.primitive_create(&rprim, rpd) ||
             g_dnnl.memory_create(&src, p->mdu.h, g_dnnl.engine, (void *)b_data) ||
             g_dnnl.memory_create(&p->mem_b, wmd, g_dnnl.engine, NULL);
    p->npacked = g->copies > 0 ? g->copies : 1;
    p->packed = rc ? NULL : calloc((size_t)p->npacked, sizeof *p->packed);
    for (int i = 0; p->packed && i < p->npacked && !rc; ++i) {
        const dnnl_exec_arg args[2] = {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, p->mem_b}};
        rc = !(p->packed[i] = bench_alloc_uninit(bytes)) ||
             g_dnnl.memory_set_data_handle(p->mem_b, p->packed[i]) ||
             g_dnnl.primitive_execute(rprim, g_dnnl.stream, 2, args) || g_dnnl.stream_wait(g_dnnl.stream);
    }
    if (src)
        g_dnnl.memory_destroy(src);
    if (rprim)
        g_dnnl.primitive_destroy(rprim);
    if (rpd)
        g_dnnl.pd_destroy(rpd);
    bench_free(tmp);
    return rc || !p->packed;
}

/* The matmul primitive in the peer's current input type; 0 on success. */
static int dnnl_primitive(peer_run *p) {
    const bench_peer_gemm *g = p->g;
    int64_t ast[2], bst[2];
    kn_strides(&g->a, g->a.t, p->conv_a, g->k, g->m, ast); /* A as [M, K]: swap back */
    const int64_t a_st[2] = {ast[1], ast[0]}, d_st[2] = {g->n, 1};
    kn_strides(&g->b, &g->b.t[0], p->conv_b, g->k, g->n, bst);
    const int dt = dnnl_dt(p->ct);
    return md_make(&p->mda, g->m, g->k, dt, a_st) || md_make(&p->mdb, g->k, g->n, dt, g->prepacked ? NULL : bst) ||
           md_make(&p->mdd, g->m, g->n, p->d_f32 ? DNNL_F32 : dnnl_dt(g->d_dtype), d_st) || matmul_pd(p) ||
           g_dnnl.primitive_create(&p->prim, p->pd);
}

static void dnnl_drop_primitive(peer_run *p) {
    if (p->prim)
        g_dnnl.primitive_destroy(p->prim);
    if (p->pd)
        g_dnnl.pd_destroy(p->pd);
    p->prim = p->pd = NULL;
    md_drop(&p->mda), md_drop(&p->mdb), md_drop(&p->mdd);
}

/* Decides the input type (BF16; FLOAT32 for FLOAT32 cases, or when this oneDNN has no BF16
 * matmul on this CPU) and which operands are converted. */
static int peer_types(peer_run *p, dg_dtype ct) {
    const bench_peer_gemm *g = p->g;
    const int qa = quantized(&g->a), qb = quantized(&g->b);
    if ((qa || qb) && (g->a.mn_major || g->b.mn_major))
        return -1; /* the dequantizer reads K-major operands only */
    if (!qa && !qb && g->a.t->dtype != g->b.t->dtype)
        return -1;
    p->ct = ct;
    p->conv_a = qa || g->a.t->dtype != ct;
    p->conv_b = qb || g->b.t->dtype != ct;
    return 0;
}

/* Buffers for the converted operands; widened BF16 B copies are filled here, once. */
static int alloc_converted(peer_run *p) {
    const bench_peer_gemm *g = p->g;
    const size_t es = ct_size(p->ct), b_bytes = (size_t)(g->n * g->k) * es;
    if (p->conv_a && !(p->ac = bench_alloc((size_t)(g->m * g->k) * es)))
        return -1;
    if (!p->conv_b || g->prepacked)
        return 0;
    if (quantized(&g->b))
        return (p->bc = bench_alloc(b_bytes)) ? 0 : -1;
    p->nbw = g->nb > 0 ? g->nb : 1;
    if (!(p->bw = calloc((size_t)p->nbw, sizeof *p->bw)))
        return -1;
    for (int i = 0; i < p->nbw; ++i) {
        if (!(p->bw[i] = bench_alloc_uninit(b_bytes)))
            return -1;
        convert(&g->b, &g->b.t[i], g->n, g->k, p->bw[i], p->ct);
    }
    return 0;
}

static int dnnl_setup(peer_run *p) {
    const bench_peer_gemm *g = p->g;
    const dg_dtype in = quantized(&g->a) ? DG_BFLOAT16 : g->a.t->dtype;
    if (peer_types(p, in == DG_FLOAT32 ? DG_FLOAT32 : DG_BFLOAT16))
        return -1;
    p->d_f32 = g->d_dtype == DG_FLOAT32;
    if (dnnl_primitive(p)) { /* e.g. oneDNN 3.2 on AVX2: no BF16 matmul; FP32 on widened inputs */
        dnnl_drop_primitive(p);
        if (p->ct == DG_FLOAT32 || peer_types(p, DG_FLOAT32))
            return -1;
        p->d_f32 = 1;
        if (dnnl_primitive(p))
            return -1;
    }
    if (alloc_converted(p) || !(p->d = bench_alloc((size_t)(g->m * g->n) * (p->d_f32 ? 4 : 2))))
        return -1;
    int64_t bst[2];
    kn_strides(&g->b, &g->b.t[0], p->conv_b, g->k, g->n, bst);
    if (g->prepacked) {
        if (dnnl_prepack(p, bst))
            return -1;
    } else if (g_dnnl.memory_create(&p->mem_b, p->mdb.h, g_dnnl.engine, p->bc ? p->bc : p->bw ? p->bw[0] : g->b.t[0].data))
        return -1;
    return g_dnnl.memory_create(&p->mem_a, p->mda.h, g_dnnl.engine, p->conv_a ? p->ac : g->a.t->data) ||
           g_dnnl.memory_create(&p->mem_d, p->mdd.h, g_dnnl.engine, p->d);
}

/* The conversions of one run (timed): A, and quantized B unless pre-packed; sets p->b_now and
 * returns B's stored copy for this run (NULL when pre-packed). */
static const dg_tensor *convert_inputs(peer_run *p) {
    const bench_peer_gemm *g = p->g;
    const double t0 = bench_now();
    if (p->conv_a)
        convert(&g->a, g->a.t, g->m, g->k, p->ac, p->ct);
    const dg_tensor *b = NULL;
    if (!g->prepacked) {
        const int i = p->next;
        b = &g->b.t[i];
        p->next = (p->next + 1) % (g->nb > 0 ? g->nb : 1);
        if (p->bc)
            convert(&g->b, b, g->n, g->k, p->bc, p->ct);
        p->b_now = p->bc ? p->bc : p->bw ? p->bw[i] : b->data;
    }
    p->dequant_s = p->conv_a || p->bc ? bench_now() - t0 : 0;
    return b;
}

static int dnnl_run(peer_run *p) {
    const bench_peer_gemm *g = p->g;
    const dg_tensor *b = convert_inputs(p);
    if (g->prepacked) {
        g_dnnl.memory_set_data_handle(p->mem_b, p->packed[p->next]);
        p->next = (p->next + 1) % p->npacked;
    } else if (b)
        g_dnnl.memory_set_data_handle(p->mem_b, (void *)p->b_now);
    const dnnl_exec_arg args[3] = {
        {DNNL_ARG_SRC, p->mem_a}, {DNNL_ARG_WEIGHTS, p->mem_b}, {DNNL_ARG_DST, p->mem_d}};
    return g_dnnl.primitive_execute(p->prim, g_dnnl.stream, 3, args) || g_dnnl.stream_wait(g_dnnl.stream);
}

/* ---- CBLAS peers: OpenBLAS (plain B, no conversion) and MKL ---- */

static int cblas_setup(peer_run *p) {
    const bench_peer_gemm *g = p->g;
    const dg_dtype in = quantized(&g->a) ? DG_BFLOAT16 : g->a.t->dtype;
    if (peer_types(p, in == DG_FLOAT32 ? DG_FLOAT32 : DG_BFLOAT16))
        return -1;
    p->d_f32 = 1;
    if (alloc_converted(p) || !(p->d = bench_alloc((size_t)(g->m * g->n) * 4)))
        return -1;
    if (!g->prepacked)
        return 0;
    /* MKL pre-packed B: converted once, packed into `copies` buffers (cblas_*_pack). */
    const int f32 = p->ct == DG_FLOAT32;
    if (p->lib != PEER_MKL || (f32 ? !g_mkl.s_pack : !g_mkl.bf16_pack))
        return -1;
    void *tmp;
    const void *b_data = b_once(p, &tmp);
    int64_t ld;
    int bt;
    operand(p, &g->b, &g->b.t[0], p->conv_b, (void *)b_data, g->n, &ld, &bt);
    const int m = (int)g->m, n = (int)g->n, k = (int)g->k, tb = bt ? CBLAS_NO_TRANS : CBLAS_TRANS;
    const size_t bytes = f32 ? g_mkl.s_pack_size(CBLAS_B_MATRIX, m, n, k) : g_mkl.bf16_pack_size(CBLAS_B_MATRIX, m, n, k);
    p->npacked = g->copies > 0 ? g->copies : 1;
    p->packed = b_data && bytes ? calloc((size_t)p->npacked, sizeof *p->packed) : NULL;
    int rc = !p->packed;
    for (int i = 0; !rc && i < p->npacked; ++i) {
        if (!(p->packed[i] = bench_alloc_uninit(bytes))) {
            rc = -1;
            break;
        }
        if (f32)
            g_mkl.s_pack(CBLAS_ROW_MAJOR, CBLAS_B_MATRIX, tb, m, n, k, 1.0f, b_data, (int)ld, p->packed[i]);
        else
            g_mkl.bf16_pack(CBLAS_ROW_MAJOR, CBLAS_B_MATRIX, tb, m, n, k, b_data, (int)ld, p->packed[i]);
    }
    bench_free(tmp);
    return rc;
}

static int cblas_run(peer_run *p) {
    const bench_peer_gemm *g = p->g;
    const dg_tensor *bt = convert_inputs(p);
    int64_t lda, ldb = 0;
    int a_t, b_t = 0;
    const void *a = operand(p, &g->a, g->a.t, p->conv_a, p->ac, g->m, &lda, &a_t);
    const void *b = bt ? operand(p, &g->b, bt, p->conv_b, (void *)p->b_now, g->n, &ldb, &b_t) : NULL;
    /* D = A @ B^T: A as stored is [M, K] (no transpose) or [K, M]; B is [N, K] (transpose) or [K, N]. */
    const int ta = a_t ? CBLAS_TRANS : CBLAS_NO_TRANS, tb = b_t ? CBLAS_NO_TRANS : CBLAS_TRANS;
    const int m = (int)g->m, n = (int)g->n, k = (int)g->k, f32 = p->ct == DG_FLOAT32;
    if (g->prepacked) { /* MKL only */
        void *w = p->packed[p->next];
        p->next = (p->next + 1) % p->npacked;
        if (f32)
            g_mkl.s_compute(CBLAS_ROW_MAJOR, ta, CBLAS_PACKED, m, n, k, a, (int)lda, w, 0, 0.0f, p->d, n);
        else
            g_mkl.bf16_compute(CBLAS_ROW_MAJOR, ta, CBLAS_PACKED, m, n, k, 1.0f, a, (int)lda, w, 0, 0.0f, p->d, n);
        return 0;
    }
    if (p->lib == PEER_MKL && f32)
        g_mkl.sgemm(CBLAS_ROW_MAJOR, ta, tb, m, n, k, 1.0f, a, (int)lda, b, (int)ldb, 0.0f, p->d, n);
    else if (p->lib == PEER_MKL)
        g_mkl.gemm_bf16(CBLAS_ROW_MAJOR, ta, tb, m, n, k, 1.0f, a, (int)lda, b, (int)ldb, 0.0f, p->d, n);
    else if (f32)
        g_blas.sgemm(CBLAS_ROW_MAJOR, ta, tb, m, n, k, 1.0f, a, (int)lda, b, (int)ldb, 0.0f, p->d, n);
    else
        g_blas.sbgemm(CBLAS_ROW_MAJOR, ta, tb, m, n, k, 1.0f, a, (int)lda, b, (int)ldb, 0.0f, p->d, n);
    return 0;
}

static void peer_free(peer_run *p) {
    if (p->lib == PEER_ONEDNN) {
        void *mems[3] = {p->mem_a, p->mem_b, p->mem_d};
        for (int i = 0; i < 3; ++i)
            if (mems[i])
                g_dnnl.memory_destroy(mems[i]);
        dnnl_drop_primitive(p);
        md_drop(&p->mdu);
    }
    for (int i = 0; p->packed && i < p->npacked; ++i)
        bench_free(p->packed[i]);
    free(p->packed);
    bench_free(p->ac);
    bench_free(p->bc);
    for (int i = 0; p->bw && i < p->nbw; ++i)
        bench_free(p->bw[i]);
    free(p->bw);
    bench_free(p->d);
    free(p);
}

/* calc_diff of the peer's D on the rows the case sampled. */
static double peer_diff(const peer_run *p, const float *ours) {
    const bench_peer_gemm *g = p->g;
    const int64_t rows = g->rows ? g->nrows : g->m;
    float *x = bench_alloc_uninit((size_t)(rows * g->n) * sizeof(float));
    if (!x)
        return -1;
    for (int64_t i = 0; i < rows; ++i) {
        const int64_t r = g->rows ? g->rows[i] : i;
        for (int64_t j = 0; j < g->n; ++j)
            x[i * g->n + j] = p->d_f32 ? ((const float *)p->d)[r * g->n + j]
                                       : dg_bf16_to_float(((const uint16_t *)p->d)[r * g->n + j]);
    }
    const double d = bench_calc_diff(x, ours, (size_t)(rows * g->n));
    bench_free(x);
    return d;
}

static void time_one(peer_run *p, const char *label, const float *ours, int reps, double budget,
                     bench_peer_result *r) {
    const bench_peer_gemm *g = p->g;
    int (*run)(peer_run *) = p->lib == PEER_ONEDNN ? dnnl_run : cblas_run;
    memset(r, 0, sizeof *r);
    r->diff = -1;
    const int setup_rc = p->lib == PEER_ONEDNN ? dnnl_setup(p) : cblas_setup(p);
    const int qa = quantized(&g->a), qb = quantized(&g->b);
    /* e.g. "onednn 3.2.0 plain+widen f32", "mkl 2026.2 prepacked+dequant" */
    snprintf(r->name, sizeof r->name, "%.38s %s%s%s", label, g->prepacked ? "prepacked" : "plain",
             qa || qb ? "+dequant" : p->conv_a || p->conv_b ? "+widen" : "",
             p->ct == DG_FLOAT32 && (qa || qb || g->a.t->dtype != DG_FLOAT32) ? " f32" : "");
    if (p->d_f32 && g->d_dtype != DG_FLOAT32)
        snprintf(r->note, sizeof r->note, "%s",
                 p->lib != PEER_ONEDNN ? "writes FP32 D"
                 : qb || g->prepacked  ? "no BF16 matmul here: FP32 on widened inputs, FP32 D"
                                       : "no BF16 matmul here: FP32, B widened once, A per run, FP32 D");
    if (setup_rc || run(p)) {
        snprintf(r->note, sizeof r->note, "%s", p->lib == PEER_ONEDNN ? "oneDNN refused the problem" : "failed");
        return;
    }
    r->diff = ours ? peer_diff(p, ours) : -1;
    /* as ours (dgbench.c): every rotated copy read once before timing, within the budget */
    const int rotation = g->prepacked ? g->copies : g->nb;
    double warm = 0;
    for (int i = 1; i < rotation && warm < budget; ++i) {
        const double t0 = bench_now();
        if (run(p)) {
            snprintf(r->note, sizeof r->note, "run failed");
            return;
        }
        warm += bench_now() - t0;
    }
    r->seconds = 1e30;
    double spent = 0;
    for (int rep = 0; rep < reps && (rep == 0 || spent < budget); ++rep) {
        const double t0 = bench_now();
        if (run(p)) {
            snprintf(r->note, sizeof r->note, "run failed");
            return;
        }
        const double t = bench_now() - t0;
        spent += t;
        if (t < r->seconds)
            r->seconds = t, r->dequant_s = p->dequant_s;
    }
    r->ok = 1;
}

static void run_peer(const bench_peer_gemm *g, int lib, const char *label, const float *ours, int reps,
                     double budget, bench_peer_result *r) {
    peer_run *p = calloc(1, sizeof *p);
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", label);
    snprintf(r->note, sizeof r->note, "out of memory");
    if (!p)
        return;
    p->g = g, p->lib = lib;
    time_one(p, label, ours, reps, budget, r);
    peer_free(p);
}

int bench_peers_run(const bench_peer_gemm *g, const float *ours, int reps, double budget,
                    bench_peer_result *out) {
    int n = 0;
    char label[40];
    const int qa = quantized(&g->a), qb = quantized(&g->b);
    const dg_dtype dt = g->a.t->dtype;
    if (g_dnnl.major) {
        snprintf(label, sizeof label, "onednn %.24s", g_dnnl.version);
        run_peer(g, PEER_ONEDNN, label, ours, reps, budget, &out[n++]);
    }
    /* MKL: BF16 (and converted FP8 / FP4) through cblas_gemm_bf16bf16f32, FLOAT32 through
     * cblas_sgemm; pre-packed B through their _pack / _compute. Strided rows: ld only. */
    const int mkl_ok = (qa || qb || dt == DG_BFLOAT16) ? g_mkl.gemm_bf16 != NULL : dt == DG_FLOAT32 && g_mkl.sgemm;
    if (mkl_ok && (qa || g->a.t->strides[1] == 1) && (qb || g->b.t->strides[1] == 1)) {
        snprintf(label, sizeof label, "mkl %.24s", g_mkl.version);
        run_peer(g, PEER_MKL, label, ours, reps, budget, &out[n++]);
    }
    /* OpenBLAS has no pre-packed CBLAS call and no FP8; BF16 needs cblas_sbgemm. */
    if (!g->prepacked && !qa && !qb && dt == g->b.t->dtype &&
        ((dt == DG_FLOAT32 && g_blas.sgemm) || (dt == DG_BFLOAT16 && g_blas.sbgemm)) &&
        g->a.t->strides[1] == 1 && g->b.t->strides[1] == 1) { /* rows of the stored matrices are dense */
        snprintf(label, sizeof label, "openblas %.24s", g_blas.version);
        run_peer(g, PEER_OPENBLAS, label, ours, reps, budget, &out[n++]);
    }
    return n;
}
