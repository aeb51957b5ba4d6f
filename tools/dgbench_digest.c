/*
 * dgbench_digest.c - `dgbench --digest`: for each case, one call of the default backend on the
 * case's digest shape (BENCH_SIZE_DIGEST) from inputs of fixed seeds made portably
 * (bench_portable_inputs), then a 64-bit FNV-1a hash of every byte of the case's outputs. No
 * timing, no reference run, no peers. One line per case:
 *
 *   # dgbench digest v1: FNV-1a 64 of each case's whole outputs, ...
 *   # deepgemm-cpu 0.1.0 | arch x86_64 | isa avx2 | threads 2
 *   gemm/bf16_nt/n2112_k7168                          avx2         1f0c...
 *
 * The library promises the same bits for the same inputs on every machine of one ISA level,
 * whatever the thread count (README, "Reproducibility"); tests/test_digest.sh checks this
 * machine's digests against tests/digests/<level>.txt, which `--write DIR` produces.
 */
#include "dgbench.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(_M_X64)
#define BENCH_ARCH "x86_64"
#elif defined(__aarch64__)
#define BENCH_ARCH "aarch64"
#else
#define BENCH_ARCH "other"
#endif

static uint64_t fnv_bytes(uint64_t h, const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* Row-major walk over any strides; a contiguous last dimension is hashed a row at a time. */
uint64_t bench_hash_tensor(uint64_t h, const dg_tensor *t) {
    const int64_t n = dg_tensor_numel(t);
    if (n == 0 || t->ndim == 0)
        return n == 0 ? h : fnv_bytes(h, t->data, dg_dtype_size(t->dtype));
    const size_t es = dg_dtype_size(t->dtype);
    const int last = t->ndim - 1;
    const int64_t row = t->shape[last];
    int64_t idx[DG_MAX_DIMS] = {0};
    for (int64_t done = 0; done < n; done += row) {
        int64_t off = 0;
        for (int d = 0; d < last; ++d)
            off += idx[d] * t->strides[d];
        const unsigned char *base = (const unsigned char *)t->data + (size_t)off * es;
        if (t->strides[last] == 1 || row == 1)
            h = fnv_bytes(h, base, (size_t)row * es);
        else
            for (int64_t j = 0; j < row; ++j)
                h = fnv_bytes(h, base + (size_t)(j * t->strides[last]) * es, es);
        for (int d = last - 1; d >= 0; --d) {
            if (++idx[d] < t->shape[d])
                break;
            idx[d] = 0;
        }
    }
    return h;
}

typedef struct digest_line {
    const char *name;
    char text[24]; /* 16 hex digits, or "FAILED" */
    char error[160];
} digest_line;

static void header(FILE *f) {
    fprintf(f, "# dgbench digest v1: FNV-1a 64 of each case's whole outputs after one call of the default backend on "
               "its digest shape (portable inputs from fixed seeds). Regenerate: DG_ISA=<level> dgbench --digest "
               "--write tests/digests\n");
    fprintf(f, "# deepgemm-cpu %s | arch %s | isa %s | threads %d\n", dg_version_string(), BENCH_ARCH,
            dg_isa_name(dg_get_isa()), dg_get_num_sms());
}

static void line(FILE *f, const digest_line *l) {
    if (l->error[0])
        fprintf(f, "%-56s %-12s FAILED: %s\n", l->name, dg_isa_name(dg_get_isa()), l->error);
    else
        fprintf(f, "%-56s %-12s %s\n", l->name, dg_isa_name(dg_get_isa()), l->text);
}

static void digest_case(const bench_case *c, digest_line *l) {
    l->name = c->name;
    bench_work w;
    memset(&w, 0, sizeof w);
    if (c->setup(c, BENCH_SIZE_DIGEST, &w) != 0) {
        snprintf(l->error, sizeof l->error, "setup failed (out of memory?)");
        return;
    }
    const dg_status s = c->run(w.state);
    if (s != DG_OK) {
        snprintf(l->error, sizeof l->error, "run: %s", dg_last_error());
    } else {
        uint64_t h = BENCH_FNV_INIT;
        if (w.ndigest == 0)
            h = bench_hash_tensor(h, &w.out);
        for (int i = 0; i < w.ndigest; ++i)
            h = bench_hash_tensor(h, &w.digest[i]);
        snprintf(l->text, sizeof l->text, "%016llx", (unsigned long long)h);
    }
    c->free(w.state);
}

static int write_json(const char *path, const digest_line *ls, int n) {
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fprintf(f, "{\n  \"version\": \"%s\",\n  \"digest\": \"fnv1a64\",\n  \"arch\": \"%s\",\n  \"isa\": \"%s\",\n"
               "  \"threads\": %d,\n  \"cases\": [",
            dg_version_string(), BENCH_ARCH, dg_isa_name(dg_get_isa()), dg_get_num_sms());
    for (int i = 0; i < n; ++i) { /* case names and errors hold no quotes or backslashes */
        fprintf(f, "%s\n    {\"name\": \"%s\", \"isa\": \"%s\", \"ok\": %s, ", i ? "," : "", ls[i].name,
                dg_isa_name(dg_get_isa()), ls[i].error[0] ? "false" : "true");
        if (ls[i].error[0])
            fprintf(f, "\"error\": \"%s\"}", ls[i].error);
        else
            fprintf(f, "\"digest\": \"%s\"}", ls[i].text);
    }
    fprintf(f, "\n  ]\n}\n");
    return fclose(f) == 0 ? 0 : -1;
}

int bench_digest(const bench_case *const *cases, int n, const char *json, const char *write_dir) {
    if (dg_get_backend() == DG_BACKEND_REFERENCE) {
        fprintf(stderr, "dgbench: --digest hashes the default backend's outputs; unset DG_BACKEND\n");
        return 2;
    }
    bench_portable_inputs = 1;
    digest_line *ls = calloc((size_t)n + 1, sizeof *ls);
    if (!ls)
        return 1;
    FILE *out = NULL;
    char path[4096] = "";
    if (write_dir) {
        snprintf(path, sizeof path, "%s/%s.txt", write_dir, dg_isa_name(dg_get_isa()));
        out = fopen(path, "w");
        if (!out) {
            fprintf(stderr, "dgbench: cannot write %s: %s\n", path, strerror(errno));
            free(ls);
            return 1;
        }
        header(out);
    }
    header(stdout);
    int failed = 0;
    for (int i = 0; i < n; ++i) {
        digest_case(cases[i], &ls[i]);
        failed += ls[i].error[0] != 0;
        line(stdout, &ls[i]);
        fflush(stdout);
        if (out)
            line(out, &ls[i]);
    }
    if (out && (fclose(out) != 0 || failed)) { /* never leave a reference file with failures in it */
        fprintf(stderr, "dgbench: %s not written (%s)\n", path, failed ? "a case failed" : strerror(errno));
        remove(path);
        ++failed;
    } else if (out) {
        fprintf(stderr, "dgbench: wrote %s\n", path);
    }
    if (json && write_json(json, ls, n) != 0) {
        fprintf(stderr, "dgbench: cannot write %s\n", json);
        ++failed;
    }
    free(ls);
    return failed ? 1 : 0;
}
