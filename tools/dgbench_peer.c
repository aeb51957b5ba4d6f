/*
 * dgbench_peer.c - oneDNN and OpenBLAS timed on a case's inputs (see dgbench_peer.h).
 *
 * Both are reached through dlopen/dlsym with prototypes declared here, so no header or
 * library of theirs is needed at build time. oneDNN 2.x and 3.x share every name, enum value
 * and argument index used below except how memory / operation descriptors are made: 2.x
 * fills caller-owned structs (dnnl_memory_desc_init_*, dnnl_matmul_desc_init +
 * dnnl_primitive_desc_create), 3.x returns handles (dnnl_memory_desc_create_*,
 * dnnl_matmul_primitive_desc_create). Both are passed around as `const void *`.
 */
#define _GNU_SOURCE /* RTLD_DEFAULT */
#include "dgbench_peer.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#define LOAD(lib, fp, name) (*(void **)&(fp) = dlsym((lib), (name)))

/* ---- oneDNN ---- */

typedef int dnnl_status; /* 0: success */
typedef struct { int arg; void *memory; } dnnl_exec_arg;
typedef struct { int major, minor, patch; const char *hash; unsigned cpu_runtime, gpu_runtime; } dnnl_ver;
enum {
    DNNL_CPU = 1, DNNL_BF16 = 2, DNNL_F32 = 3, DNNL_TAG_ANY = 1, DNNL_QUERY_WEIGHTS_MD = 131,
    DNNL_ARG_SRC = 1, DNNL_ARG_DST = 17, DNNL_ARG_WEIGHTS = 33, DNNL_STREAM_IN_ORDER = 1,
    DNNL_V2_DESC_BYTES = 16384 /* > sizeof(dnnl_matmul_desc_t) (2800 in 2.6) */
};

typedef struct onednn {
    void *lib, *engine, *stream;
    int major;
    char version[32], file[64];
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

/* ---- OpenBLAS (CBLAS row-major) ---- */

enum { CBLAS_ROW_MAJOR = 101, CBLAS_NO_TRANS = 111, CBLAS_TRANS = 112 };
typedef struct openblas {
    void *lib;
    char version[32], file[64];
    void (*sgemm)(int, int, int, int, int, int, float, const float *, int, const float *, int, float, float *,
                  int);
    void (*sbgemm)(int, int, int, int, int, int, float, const uint16_t *, int, const uint16_t *, int, float,
                   float *, int);
} openblas;

static onednn g_dnnl;
static openblas g_blas;
static int g_inited;

static void *open_first(const char *env, const char *const *names, char *file, size_t file_size) {
    const char *path = getenv(env);
    if (path && *path) {
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        const char *base = strrchr(path, '/');
        snprintf(file, file_size, "%s", base ? base + 1 : path);
        return h;
    }
    for (; *names; ++names) {
        void *h = dlopen(*names, RTLD_NOW | RTLD_LOCAL);
        if (h) {
            snprintf(file, file_size, "%s", *names);
            return h;
        }
    }
    return NULL;
}

static int onednn_load(onednn *d) {
    static const char *const names[] = {"libdnnl.so.3", "libdnnl.so.2", NULL};
    d->lib = open_first("DGBENCH_ONEDNN", names, d->file, sizeof d->file);
    if (!d->lib)
        return -1;
    const dnnl_ver *(*version)(void);
    LOAD(d->lib, version, "dnnl_version");
    if (!version)
        return -1;
    const dnnl_ver *v = version();
    d->major = v->major;
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
        snprintf(d->version + strlen(d->version), sizeof d->version - strlen(d->version), " (unusable)");
        return -1;
    }
    return 0;
}

static int openblas_load(openblas *b, int threads) {
    static const char *const names[] = {"libopenblas.so.0", "libopenblas.so", NULL};
    b->lib = open_first("DGBENCH_OPENBLAS", names, b->file, sizeof b->file);
    if (!b->lib)
        return -1;
    char *(*config)(void);
    void (*set_threads)(int);
    LOAD(b->lib, config, "openblas_get_config");
    LOAD(b->lib, set_threads, "openblas_set_num_threads");
    LOAD(b->lib, b->sgemm, "cblas_sgemm");
    LOAD(b->lib, b->sbgemm, "cblas_sbgemm");
    if (!b->sgemm && !b->sbgemm)
        return -1;
    if (set_threads)
        set_threads(threads);
    /* "OpenBLAS 0.3.21 NO_AFFINITY ..." -> "0.3.21" */
    const char *c = config ? config() : NULL, *sp = c ? strchr(c, ' ') : NULL;
    snprintf(b->version, sizeof b->version, "%.*s", sp ? (int)strcspn(sp + 1, " ") : 1, sp ? sp + 1 : "?");
    return 0;
}

void bench_peers_init(FILE *f) {
    if (g_inited)
        return;
    g_inited = 1;
    const int threads = dg_get_num_sms();
    const int have_dnnl = onednn_load(&g_dnnl) == 0, have_blas = openblas_load(&g_blas, threads) == 0;
    if (!have_dnnl)
        g_dnnl.major = 0;
    if (!have_blas)
        g_blas.sgemm = NULL, g_blas.sbgemm = NULL;
    /* oneDNN's OpenMP runtime (and ours) take their thread count from here. */
    void (*omp_threads)(int);
    LOAD(RTLD_DEFAULT, omp_threads, "omp_set_num_threads");
    if (omp_threads)
        omp_threads(threads);
    if (!have_dnnl && !have_blas) {
        fprintf(f, "\npeers: none found (looked for oneDNN libdnnl.so.3 / libdnnl.so.2 and OpenBLAS "
                   "libopenblas.so.0); `apt-get install libdnnl-dev libopenblas-dev` adds them, or set "
                   "DGBENCH_ONEDNN / DGBENCH_OPENBLAS to a library file\n");
        return;
    }
    fprintf(f, "\npeers (%d threads): ", threads);
    if (have_dnnl)
        fprintf(f, "onednn %s (%s)", g_dnnl.version, g_dnnl.file);
    else
        fprintf(f, "onednn not found (apt-get install libdnnl-dev, or DGBENCH_ONEDNN=file)");
    if (have_blas)
        fprintf(f, ", openblas %s (%s%s)", g_blas.version, g_blas.file,
                g_blas.sbgemm ? "" : "; no cblas_sbgemm: BF16 cases not compared");
    else
        fprintf(f, ", openblas not found (apt-get install libopenblas-dev, or DGBENCH_OPENBLAS=file)");
    fputc('\n', f);
}

void bench_peers_json(FILE *f) {
    fprintf(f, "{\"onednn\": ");
    if (g_dnnl.major)
        fprintf(f, "{\"version\": \"%s\", \"file\": \"%s\"}", g_dnnl.version, g_dnnl.file);
    else
        fprintf(f, "null");
    fprintf(f, ", \"openblas\": ");
    if (g_blas.sgemm || g_blas.sbgemm)
        fprintf(f, "{\"version\": \"%s\", \"file\": \"%s\", \"sbgemm\": %s}", g_blas.version, g_blas.file,
                g_blas.sbgemm ? "true" : "false");
    else
        fprintf(f, "null");
    fprintf(f, "}");
}

/* ---- dequantization to BF16: the plain loop a user would write ---- */

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

/* op [rows, K] (K-major, FLOAT8_E4M3 or FP4_E2M1X2) with its scales -> BF16 [rows, K] */
static void dequant(const bench_peer_operand *op, const dg_tensor *t, int64_t rows, int64_t k,
                    uint16_t *out) {
    static float lut8[256], lut4[16];
    if (lut8[0x38] == 0) { /* 0x38 is 1.0 in E4M3 */
        for (int i = 0; i < 256; ++i)
            lut8[i] = dg_e4m3_to_float((uint8_t)i);
        for (int i = 0; i < 16; ++i)
            lut4[i] = dg_e2m1_to_float((uint8_t)i);
    }
    const int fp4 = t->dtype == DG_FP4_E2M1X2;
    const uint8_t *q = t->data;
    for (int64_t r = 0; r < rows; ++r) {
        const uint8_t *row = q + r * t->strides[0];
        uint16_t *o = out + r * k;
        for (int64_t k0 = 0; k0 < k; k0 += op->gran_k) {
            const float s = scale_at(op->sf, r / op->gran_mn, k0 / op->gran_k);
            const int64_t k1 = k0 + op->gran_k < k ? k0 + op->gran_k : k;
            if (fp4)
                for (int64_t j = k0; j < k1; ++j)
                    o[j] = to_bf16(lut4[(row[j / 2] >> (4 * (j & 1))) & 15] * s);
            else
                for (int64_t j = k0; j < k1; ++j)
                    o[j] = to_bf16(lut8[row[j]] * s);
        }
    }
}

static int quantized(const bench_peer_operand *op) {
    return op->t->dtype == DG_FLOAT8_E4M3 || op->t->dtype == DG_FP4_E2M1X2;
}

/* ---- one peer variant on one case ---- */

typedef struct md { /* 2.x: the struct itself in v2 (696 bytes in 2.6); 3.x: the handle in h */
    void *h;
    int64_t v2[512];
} md;

typedef struct peer_run {
    const bench_peer_gemm *g;
    int lib;                /* 0: oneDNN, 1: OpenBLAS */
    md mda, mdb, mdd, mdu;  /* src, weights (as the matmul takes it), dst, user weights */
    void *pd, *prim, *mem_a, *mem_b, *mem_d;
    void **packed;          /* pre-packed weights copies */
    int npacked, next;
    uint16_t *a16, *b16;    /* dequantized A and B */
    void *d;                /* peer's D */
    double dequant_s;
} peer_run;

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

/* Strides of the logical [rows, K] operand as oneDNN's [K, rows] weights (transposed view). */
static void kn_strides(const bench_peer_operand *op, int64_t out[2]) {
    const int64_t s0 = op->t->strides[0], s1 = op->t->strides[1];
    out[0] = op->mn_major ? s0 : s1; /* step along K */
    out[1] = op->mn_major ? s1 : s0; /* step along rows */
}

static int dnnl_dt(dg_dtype t) { return t == DG_FLOAT32 ? DNNL_F32 : DNNL_BF16; }

/* Pre-packed weights: reorder B (dequantized first when quantized) into p->npacked copies. */
static int dnnl_prepack(peer_run *p, const void *b_data, const int64_t bst[2]) {
    const bench_peer_gemm *g = p->g;
    const void *wmd = g_dnnl.pd_query_md(p->pd, DNNL_QUERY_WEIGHTS_MD, 0);
    const size_t bytes = wmd ? g_dnnl.md_get_size(wmd) : 0;
    void *rpd = NULL, *rprim = NULL, *src = NULL;
    const int udt = quantized(&g->b) ? DNNL_BF16 : dnnl_dt(g->b.t->dtype);
    int rc = bytes == 0 || md_make(&p->mdu, g->k, g->n, udt, bst) ||
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
    return rc || !p->packed;
}

static int dnnl_setup(peer_run *p) {
    const bench_peer_gemm *g = p->g;
    const int qa = quantized(&g->a), qb = quantized(&g->b);
    if ((qa || qb) && (g->a.mn_major || g->b.mn_major))
        return -1; /* the dequantizer reads K-major operands only */
    if (!qa && !qb && g->a.t->dtype != g->b.t->dtype)
        return -1;
    int64_t ast[2], bst[2];
    kn_strides(&g->a, ast); /* A as [M, K]: swap back */
    const int64_t a_st[2] = {qa ? g->k : ast[1], qa ? 1 : ast[0]};
    if (qb)
        bst[0] = 1, bst[1] = g->k;
    else
        kn_strides(&g->b, bst);
    const int64_t d_st[2] = {g->n, 1};
    const int wdt = qb ? DNNL_BF16 : dnnl_dt(g->b.t->dtype);
    if (md_make(&p->mda, g->m, g->k, qa ? DNNL_BF16 : dnnl_dt(g->a.t->dtype), a_st) ||
        md_make(&p->mdb, g->k, g->n, wdt, g->prepacked ? NULL : bst) ||
        md_make(&p->mdd, g->m, g->n, dnnl_dt(g->d_dtype), d_st) || matmul_pd(p) ||
        g_dnnl.primitive_create(&p->prim, p->pd))
        return -1;
    if (qb && g->prepacked) { /* weights dequantized once, like the packing */
        uint16_t *w = bench_alloc_uninit((size_t)(g->n * g->k) * 2);
        const int rc = !w ? -1 : (dequant(&g->b, &g->b.t[0], g->n, g->k, w), dnnl_prepack(p, w, bst));
        bench_free(w);
        if (rc)
            return -1;
    } else if (g->prepacked) {
        if (dnnl_prepack(p, g->b.t[0].data, bst))
            return -1;
    } else if (g_dnnl.memory_create(&p->mem_b, p->mdb.h, g_dnnl.engine, qb ? (void *)p->b16 : g->b.t[0].data))
        return -1;
    return g_dnnl.memory_create(&p->mem_a, p->mda.h, g_dnnl.engine, qa ? (void *)p->a16 : g->a.t->data) ||
           g_dnnl.memory_create(&p->mem_d, p->mdd.h, g_dnnl.engine, p->d);
}

static int dnnl_run(peer_run *p) {
    const bench_peer_gemm *g = p->g;
    const double t0 = bench_now();
    const int qa = quantized(&g->a), qb = quantized(&g->b);
    if (qa)
        dequant(&g->a, g->a.t, g->m, g->k, p->a16);
    if (g->prepacked) {
        g_dnnl.memory_set_data_handle(p->mem_b, p->packed[p->next]);
        p->next = (p->next + 1) % p->npacked;
    } else {
        const dg_tensor *b = &g->b.t[p->next];
        p->next = (p->next + 1) % (g->nb > 0 ? g->nb : 1);
        if (qb)
            dequant(&g->b, b, g->n, g->k, p->b16);
        else
            g_dnnl.memory_set_data_handle(p->mem_b, b->data);
    }
    p->dequant_s = qa || qb ? bench_now() - t0 : 0;
    const dnnl_exec_arg args[3] = {
        {DNNL_ARG_SRC, p->mem_a}, {DNNL_ARG_WEIGHTS, p->mem_b}, {DNNL_ARG_DST, p->mem_d}};
    return g_dnnl.primitive_execute(p->prim, g_dnnl.stream, 3, args) || g_dnnl.stream_wait(g_dnnl.stream);
}

static int blas_run(peer_run *p) {
    const bench_peer_gemm *g = p->g;
    const dg_tensor *a = g->a.t, *b = &g->b.t[p->next];
    p->next = (p->next + 1) % (g->nb > 0 ? g->nb : 1);
    /* D = A @ B^T: A as stored is [M, K] (no transpose) or [K, M]; B is [N, K] (transpose) or [K, N]. */
    const int ta = g->a.mn_major ? CBLAS_TRANS : CBLAS_NO_TRANS;
    const int tb = g->b.mn_major ? CBLAS_NO_TRANS : CBLAS_TRANS;
    const int m = (int)g->m, n = (int)g->n, k = (int)g->k, lda = (int)a->strides[0], ldb = (int)b->strides[0];
    if (a->dtype == DG_FLOAT32)
        g_blas.sgemm(CBLAS_ROW_MAJOR, ta, tb, m, n, k, 1.0f, a->data, lda, b->data, ldb, 0.0f, p->d, n);
    else
        g_blas.sbgemm(CBLAS_ROW_MAJOR, ta, tb, m, n, k, 1.0f, a->data, lda, b->data, ldb, 0.0f, p->d, n);
    return 0;
}

static void peer_free(peer_run *p) {
    if (p->lib == 0) {
        void *mems[3] = {p->mem_a, p->mem_b, p->mem_d};
        for (int i = 0; i < 3; ++i)
            if (mems[i])
                g_dnnl.memory_destroy(mems[i]);
        if (p->prim)
            g_dnnl.primitive_destroy(p->prim);
        if (p->pd)
            g_dnnl.pd_destroy(p->pd);
        md_drop(&p->mda), md_drop(&p->mdb), md_drop(&p->mdd), md_drop(&p->mdu);
    }
    for (int i = 0; p->packed && i < p->npacked; ++i)
        bench_free(p->packed[i]);
    free(p->packed);
    bench_free(p->a16);
    bench_free(p->b16);
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
    const int f32 = p->lib == 1 || g->d_dtype == DG_FLOAT32;
    for (int64_t i = 0; i < rows; ++i) {
        const int64_t r = g->rows ? g->rows[i] : i;
        for (int64_t j = 0; j < g->n; ++j)
            x[i * g->n + j] = f32 ? ((const float *)p->d)[r * g->n + j]
                                  : dg_bf16_to_float(((const uint16_t *)p->d)[r * g->n + j]);
    }
    const double d = bench_calc_diff(x, ours, (size_t)(rows * g->n));
    bench_free(x);
    return d;
}

static void time_one(peer_run *p, const float *ours, int reps, double budget, bench_peer_result *r) {
    const bench_peer_gemm *g = p->g;
    int (*run)(peer_run *) = p->lib == 0 ? dnnl_run : blas_run;
    const int f32 = p->lib == 1 || g->d_dtype == DG_FLOAT32;
    p->d = bench_alloc((size_t)(g->m * g->n) * (f32 ? 4 : 2));
    if (quantized(&g->a))
        p->a16 = bench_alloc((size_t)(g->m * g->k) * 2);
    if (quantized(&g->b) && !g->prepacked)
        p->b16 = bench_alloc((size_t)(g->n * g->k) * 2);
    if (!p->d || (quantized(&g->a) && !p->a16) || (quantized(&g->b) && !g->prepacked && !p->b16)) {
        snprintf(r->note, sizeof r->note, "out of memory");
        return;
    }
    if ((p->lib == 0 && dnnl_setup(p)) || run(p)) {
        snprintf(r->note, sizeof r->note, "%s", p->lib == 0 ? "oneDNN refused the problem" : "failed");
        return;
    }
    r->diff = ours ? peer_diff(p, ours) : -1;
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

int bench_peers_run(const bench_peer_gemm *g, const float *ours, int reps, double budget,
                    bench_peer_result *out) {
    int n = 0;
    const int qa = quantized(&g->a), qb = quantized(&g->b);
    if (g_dnnl.major) {
        bench_peer_result *r = &out[n++];
        memset(r, 0, sizeof *r);
        r->diff = -1;
        snprintf(r->name, sizeof r->name, "onednn %s %s%s", g_dnnl.version,
                 g->prepacked ? "prepacked" : "plain", qa || qb ? "+dequant" : "");
        peer_run *p = calloc(1, sizeof *p);
        if (p) {
            p->g = g, p->lib = 0;
            time_one(p, ours, reps, budget, r);
            peer_free(p);
        }
    }
    /* OpenBLAS has no pre-packed CBLAS call and no FP8; BF16 needs cblas_sbgemm. */
    const dg_dtype dt = g->a.t->dtype;
    if (!g->prepacked && !qa && !qb && dt == g->b.t->dtype &&
        ((dt == DG_FLOAT32 && g_blas.sgemm) || (dt == DG_BFLOAT16 && g_blas.sbgemm)) &&
        g->a.t->strides[1] == 1 && g->b.t->strides[1] == 1) { /* rows of the stored matrices are dense */
        bench_peer_result *r = &out[n++];
        memset(r, 0, sizeof *r);
        r->diff = -1;
        snprintf(r->name, sizeof r->name, "openblas %s %s", g_blas.version,
                 dt == DG_FLOAT32 ? "sgemm" : "sbgemm");
        if (g->d_dtype != DG_FLOAT32)
            snprintf(r->note, sizeof r->note, "writes FP32 D");
        peer_run *p = calloc(1, sizeof *p);
        if (p) {
            p->g = g, p->lib = 1;
            time_one(p, ours, reps, budget, r);
            peer_free(p);
        }
    }
    return n;
}
