/*
 * dgbench - deepgemm-cpu's benchmark. Measures this machine's limits (BF16 / FP32 / INT8
 * compute, DRAM read bandwidth) on all kernel threads, then times each kernel case and
 * prints, in one table: best time, GFLOPS, GB/s, the share of the case's limit reached, and
 * calc_diff of the default backend's output against the reference backend's output. Cases
 * that describe their GEMM to the peer libraries found at run time (oneDNN, MKL, OpenBLAS; see
 * dgbench_peer.h) get one more line per peer: its time on the same inputs and ours/peer.
 *
 *   dgbench [--quick] [--json FILE] [--plot FILE.png] [--reps N] [--no-peaks] [--no-peers] [FILTER...]
 *   dgbench --digest [--write DIR] [--json FILE] [FILTER...]
 *   dgbench --list | --info | --help
 *
 * --digest prints a hash of each case's outputs instead of timing it (dgbench_digest.c).
 * --plot draws the run's roofline with tools/dgplot.py (python3 with matplotlib).
 *
 * A case runs when its name contains any FILTER (all cases when none is given).
 * Uses only the public header. Exit status: 0, 1 when a case failed, 2 on bad usage or when
 * no case matches.
 */
#include "dgbench.h"
#include "dgbench_peer.h"

#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* Every kernel family's cases; a new family adds its dgbench_<family>.c and one line here. */
static const bench_family *const g_families[] = {
    &bench_family_quant,   &bench_family_gemm,     &bench_family_grouped,
    &bench_family_mqa,     &bench_family_hc_einsum, &bench_family_mega_moe,
    &bench_family_gate,
};
enum { NUM_FAMILIES = sizeof g_families / sizeof g_families[0] };

/* A repetition stops being repeated once the timed runs of a case exceed this (seconds). */
#define BENCH_TIME_BUDGET 1.0

typedef struct options {
    int quick, list, info, no_peaks, no_peers, reps, digest;
    const char *json, *write_dir, *plot;
    char **filters;
    int nfilters;
} options;

typedef struct result {
    const bench_case *c;
    bench_work w;
    int ok;
    char error[160];
    double seconds;  /* best of the timed runs */
    double diff;     /* calc_diff(default backend, reference backend); < 0: not computed */
    const char *limit_name;
    double limit_pct; /* < 0: no limit known */
    bench_peer_result peers[BENCH_PEER_MAX];
    int npeers;
} result;

static void usage(FILE *f) {
    fprintf(f,
            "usage: dgbench [--quick] [--json FILE] [--plot FILE.png] [--reps N] [--no-peaks] [--no-peers] [FILTER...]\n"
            "       dgbench --digest [--write DIR] [--json FILE] [FILTER...]\n"
            "       dgbench --list | --info | --help\n"
            "  --quick      small shapes and short limit measurements\n"
            "  --json FILE  also write the results as JSON to FILE\n"
            "  --plot FILE  draw the results as a roofline (arithmetic intensity vs GFLOPS under the\n"
            "               measured limits) into FILE with python3 tools/dgplot.py (matplotlib;\n"
            "               DGBENCH_PLOT_SCRIPT: the script's path when not found next to the build)\n"
            "  --reps N     timed repetitions per case after one warm-up (default 3)\n"
            "  --no-peaks   skip measuring the machine's limits\n"
            "  --no-peers   do not time oneDNN / MKL / OpenBLAS on the same inputs\n"
            "  --digest     no timing: per case one call on a small digest shape from fixed-seed inputs,\n"
            "               then a hash (FNV-1a 64) of its whole outputs: 'case isa digest' lines\n"
            "  --write DIR  with --digest (all cases): also write DIR/<isa>.txt, the reference\n"
            "               file tests/test_digest.sh compares with (DIR: tests/digests)\n"
            "  --list       print the case names and exit\n"
            "  --info       print what the library sees on this CPU and exit\n"
            "  FILTER       run only cases whose name contains FILTER\n"
            "Environment: DG_NUM_THREADS, DG_BACKEND, DG_ISA (see README.md); DGBENCH_ONEDNN,\n"
            "DGBENCH_MKL, DGBENCH_OPENBLAS: the peer library files to load instead of searching;\n"
            "ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS: cap the peers' ISA (set from DG_ISA if unset).\n");
}

static int parse_args(int argc, char **argv, options *o) {
    memset(o, 0, sizeof *o);
    o->reps = 3;
    o->filters = calloc((size_t)argc, sizeof *o->filters);
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i];
        if (!strcmp(a, "--quick"))
            o->quick = 1;
        else if (!strcmp(a, "--list"))
            o->list = 1;
        else if (!strcmp(a, "--info"))
            o->info = 1;
        else if (!strcmp(a, "--no-peaks"))
            o->no_peaks = 1;
        else if (!strcmp(a, "--no-peers"))
            o->no_peers = 1;
        else if (!strcmp(a, "--digest"))
            o->digest = 1;
        else if (!strcmp(a, "--json") && i + 1 < argc)
            o->json = argv[++i];
        else if (!strcmp(a, "--write") && i + 1 < argc)
            o->write_dir = argv[++i];
        else if (!strcmp(a, "--plot") && i + 1 < argc)
            o->plot = argv[++i];
        else if (!strcmp(a, "--reps") && i + 1 < argc && (o->reps = atoi(argv[++i])) > 0)
            continue;
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        } else if (a[0] == '-') {
            fprintf(stderr, "dgbench: bad option '%s'\n", a);
            usage(stderr);
            return -1;
        } else
            o->filters[o->nfilters++] = argv[i];
    }
    if (o->plot && o->digest) {
        fprintf(stderr, "dgbench: --plot draws timed results, not --digest ones\n");
        return -1;
    }
    if (o->write_dir && (!o->digest || o->nfilters > 0)) {
        fprintf(stderr, "dgbench: --write needs --digest and no FILTER (a reference file holds every case)\n");
        return -1;
    }
    return 0;
}

static int selected(const options *o, const char *name) {
    if (o->nfilters == 0)
        return 1;
    for (int i = 0; i < o->nfilters; ++i)
        if (strstr(name, o->filters[i]))
            return 1;
    return 0;
}

static void print_info(void) {
    dg_cpu_info ci;
    if (dg_get_cpu_info(&ci) != DG_OK) {
        printf("cpu: %s\n", dg_last_error());
        return;
    }
    printf("deepgemm-cpu %s | %s (%s), %d logical cores\n", dg_version_string(), ci.brand,
           ci.vendor, ci.logical_cores);
    printf("isa %s (best %s) | threads %d | backend %s\n", dg_isa_name(dg_get_isa()),
           dg_isa_name(ci.best_isa), dg_get_num_sms(),
           dg_get_backend() == DG_BACKEND_REFERENCE ? "reference" : "auto");
    printf("features: avx2=%d fma=%d avx512f=%d avx512bw=%d avx512vl=%d avx512_bf16=%d "
           "avx512_vnni=%d amx_bf16=%d\n",
           ci.avx2, ci.fma, ci.avx512f, ci.avx512bw, ci.avx512vl, ci.avx512_bf16, ci.avx512_vnni,
           ci.amx_bf16);
    printf("caches: L1d %lld KiB, L2 %lld KiB, L3 %lld KiB (per core as detected; 0: unknown)\n",
           (long long)(ci.cache_bytes[1] >> 10), (long long)(ci.cache_bytes[2] >> 10),
           (long long)(ci.cache_bytes[3] >> 10));
}

static void print_peaks(const bench_peaks *p) {
    printf("\nmachine limits (%d threads)\n", p->threads);
    if (p->bf16_gflops > 0)
        printf("  bf16  %10.1f GFLOPS   VDPBF16PS zmm\n", p->bf16_gflops);
    else
        printf("  bf16         n/a          (no AVX512_BF16)\n");
    if (p->fp32_gflops > 0)
        printf("  fp32  %10.1f GFLOPS   FMA %s\n", p->fp32_gflops, p->fp32_isa);
    else
        printf("  fp32         n/a          (no AVX2/FMA)\n");
    if (p->fp32_ymm_gflops > 0 && p->fp32_isa && strcmp(p->fp32_isa, "avx2") != 0)
        printf("  fp32_ymm %7.1f GFLOPS   FMA avx2 (the limit of isa avx2)\n", p->fp32_ymm_gflops);
    if (p->int8_gops > 0)
        printf("  int8  %10.1f GOPS     VPDPBUSD zmm\n", p->int8_gops);
    else
        printf("  int8         n/a          (no AVX512_VNNI)\n");
    if (p->amx_bf16_gflops > 0) /* printed only where measured */
        printf("  amx_bf16 %7.1f GFLOPS   TDPBF16PS tiles\n", p->amx_bf16_gflops);
    if (p->amx_int8_gops > 0)
        printf("  amx_int8 %7.1f GOPS     TDPBSSD tiles\n", p->amx_int8_gops);
    if (p->dram_gbps > 0)
        printf("  dram  %10.1f GB/s     read, %zu MiB buffer\n", p->dram_gbps,
               p->dram_buffer_bytes >> 20);
    else
        printf("  dram         n/a\n");
}

/* The compute limit for a case: the fastest measured instruction of the ISA level the library
 * runs that can do its arithmetic, so that a lower level (DG_ISA) is rated against its own
 * ceiling, not the machine's best. On isa amx the kernels use tiles, so BF16 and INT8 cases
 * are rated against TDPBF16PS / TDPBSSD. At avx512_bf16 BF16 products are exact in FP32, so
 * zmm FMA counts for BF16 too (on some CPUs it is the faster of the two); INT8 uses VPDPBUSD.
 * avx512 has neither VDPBF16PS nor VNNI: every kind is rated against zmm FMA. avx2 and portable
 * C against ymm FMA (the compiler may vectorize portable C to that width at most). */
static double compute_peak(const bench_peaks *p, bench_limit l, const char **name) {
    *name = NULL;
    if (l == BENCH_LIMIT_DRAM)
        return 0;
    const dg_isa isa = dg_get_isa();
    if (isa == DG_ISA_AMX) {
        if (l == BENCH_LIMIT_BF16 && p->amx_bf16_gflops > 0)
            return *name = "amx_bf16", p->amx_bf16_gflops;
        if (l == BENCH_LIMIT_INT8 && p->amx_int8_gops > 0)
            return *name = "amx_int8", p->amx_int8_gops;
    }
    if (isa <= DG_ISA_AVX2)
        return p->fp32_ymm_gflops > 0 ? (*name = "fp32_ymm", p->fp32_ymm_gflops) : 0;
    double best = 0;
    if (isa >= DG_ISA_AVX512_BF16) {
        if (l == BENCH_LIMIT_BF16 && p->bf16_gflops > 0)
            *name = "bf16", best = p->bf16_gflops;
        if (l == BENCH_LIMIT_INT8 && p->int8_gops > 0)
            *name = "int8", best = p->int8_gops;
    }
    if ((best == 0 || l == BENCH_LIMIT_BF16) && p->fp32_gflops > best)
        *name = "fp32", best = p->fp32_gflops;
    return best;
}

/* Roofline share: the larger lower bound on time (compute or DRAM) over the measured time. */
static void rate_against_limits(result *r, const bench_peaks *p) {
    const char *cname;
    const double cpeak = compute_peak(p, r->c->limit, &cname);
    const double t_compute = cpeak > 0 ? r->w.flops / (cpeak * 1e9) : 0;
    const double t_memory = p->dram_gbps > 0 ? r->w.bytes / (p->dram_gbps * 1e9) : 0;
    r->limit_name = t_compute >= t_memory ? cname : "dram";
    const double bound = t_compute > t_memory ? t_compute : t_memory;
    r->limit_pct = bound > 0 && r->seconds > 0 ? 100.0 * bound / r->seconds : -1;
}

static int fail(result *r, const char *what) {
    snprintf(r->error, sizeof r->error, "%s: %s", what, dg_last_error());
    return -1;
}

/* Warm-up (its output is the default backend's; then the rest of the weights' rotation),
 * timed repetitions, then one reference run. */
static int run_case(result *r, const options *o) {
    const bench_case *c = r->c;
    if (c->setup(c, o->quick, &r->w) != 0) {
        snprintf(r->error, sizeof r->error, "setup failed (out of memory?)");
        return -1;
    }
    const size_t n = (size_t)dg_tensor_numel(&r->w.out);
    float *got = bench_alloc(n * sizeof(float)), *want = bench_alloc(n * sizeof(float));
    int rc = -1;
    if (!got || !want) {
        snprintf(r->error, sizeof r->error, "out of memory");
        goto done;
    }
    if (c->run(r->w.state) != DG_OK) {
        fail(r, "run");
        goto done;
    }
    bench_read_float(&r->w.out, got);
    double warm = 0; /* the rest of the rotation (bench_work.rotation), within the time budget */
    for (int i = 1; i < r->w.rotation && warm < BENCH_TIME_BUDGET; ++i) {
        const double t0 = bench_now();
        if (c->run(r->w.state) != DG_OK) {
            fail(r, "run");
            goto done;
        }
        warm += bench_now() - t0;
    }
    r->seconds = 1e30;
    double spent = 0;
    for (int rep = 0; rep < o->reps && (rep == 0 || spent < BENCH_TIME_BUDGET); ++rep) {
        const double t0 = bench_now();
        if (c->run(r->w.state) != DG_OK) {
            fail(r, "run");
            goto done;
        }
        const double t = bench_now() - t0;
        spent += t;
        if (t < r->seconds)
            r->seconds = t;
    }
    r->diff = -1; /* stays -1 (printed "-") when the default backend is the reference */
    const dg_backend backend = dg_get_backend();
    if (backend != DG_BACKEND_REFERENCE) {
        dg_set_backend(DG_BACKEND_REFERENCE);
        const dg_status s = c->run(r->w.state);
        dg_set_backend(backend);
        if (s != DG_OK) {
            fail(r, "reference run");
            goto done;
        }
        bench_read_float(&r->w.out, want);
        r->diff = bench_calc_diff(got, want, n);
    }
    if (!o->no_peers && r->w.peer)
        r->npeers = bench_peers_run(r->w.peer, got, o->reps, BENCH_TIME_BUDGET, r->peers);
    r->ok = 1;
    rc = 0;
done:
    bench_free(got);
    bench_free(want);
    c->free(r->w.state);
    return rc;
}

/* Says which measured limit %lim uses for each kind of case, then the column names. */
static void print_row_header(const bench_peaks *p) {
    static const char *const kinds[] = {"bf16", "fp32", "int8"};
    if (p->threads == 0) { /* --no-peaks */
        printf("\n%%lim: not computed (--no-peaks)\n");
    } else {
        printf("\n%%lim: the larger of the compute and DRAM lower bounds on time over the time "
               "(isa %s:", dg_isa_name(dg_get_isa()));
        for (int l = BENCH_LIMIT_BF16; l <= BENCH_LIMIT_INT8; ++l) {
            const char *name;
            const double peak = compute_peak(p, (bench_limit)l, &name);
            printf(" %s cases %s %.0f %s,", kinds[l], name ? name : "n/a", peak,
                   l == BENCH_LIMIT_INT8 ? "GOPS" : "GFLOPS");
        }
        printf(" dram %.1f GB/s)\n", p->dram_gbps);
    }
    printf("%-38s %-26s %10s %9s %8s %8s %6s %9s\n", "case", "shape", "time(ms)", "GFLOPS",
           "GB/s", "limit", "%lim", "diff");
}

static void print_row(const result *r) {
    if (!r->ok) {
        printf("%-38s %-26s  FAILED: %s\n", r->c->name, r->w.shape, r->error);
        return;
    }
    char pct[16] = "-";
    if (r->limit_pct >= 0)
        snprintf(pct, sizeof pct, "%.1f", r->limit_pct);
    char gflops[16] = "-", diff[16] = "-";
    if (r->diff >= 0)
        snprintf(diff, sizeof diff, "%.2e", r->diff);
    if (r->w.flops > 0)
        snprintf(gflops, sizeof gflops, "%.2f", 1e-9 * r->w.flops / r->seconds);
    printf("%-38s %-26s %10.2f %9s %8.2f %8s %6s %9s\n", r->c->name, r->w.shape,
           1e3 * r->seconds, gflops, 1e-9 * r->w.bytes / r->seconds,
           r->limit_name ? r->limit_name : "-", pct, diff);
    for (int i = 0; i < r->npeers; ++i) { /* one line per peer, under our row */
        const bench_peer_result *q = &r->peers[i];
        if (!q->ok) {
            printf("  peer %-59s  %s\n", q->name, q->note);
            continue;
        }
        char extra[128] = "";
        if (q->dequant_s > 0)
            snprintf(extra, sizeof extra, "  (dequant %.2f ms)", 1e3 * q->dequant_s);
        printf("  peer %-59s %10.2f %9.2f  ours/peer %5.2fx  diff %.2e%s%s%s\n", q->name,
               1e3 * q->seconds, 1e-9 * r->w.flops / q->seconds, q->seconds / r->seconds, q->diff,
               extra, q->note[0] ? "  " : "", q->note);
    }
}

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; ++s) {
        if (*s == '"' || *s == '\\')
            fputc('\\', f);
        if ((unsigned char)*s >= 0x20)
            fputc(*s, f);
    }
    fputc('"', f);
}

static int write_json(const char *path, const bench_peaks *p, const result *rs, int n, int quick) {
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    dg_cpu_info ci;
    memset(&ci, 0, sizeof ci);
    dg_get_cpu_info(&ci);
    fprintf(f, "{\n  \"version\": \"%s\",\n  \"cpu\": ", dg_version_string());
    json_string(f, ci.brand);
    fprintf(f, ",\n  \"isa\": \"%s\",\n  \"threads\": %d,\n  \"backend\": \"%s\",\n  \"quick\": %s,\n",
            dg_isa_name(dg_get_isa()), dg_get_num_sms(),
            dg_get_backend() == DG_BACKEND_REFERENCE ? "reference" : "auto", quick ? "true" : "false");
    fprintf(f, "  \"limits\": {\"bf16_gflops\": %.3f, \"fp32_gflops\": %.3f, "
               "\"fp32_ymm_gflops\": %.3f, \"int8_gops\": %.3f, "
               "\"dram_gbps\": %.3f, \"amx_bf16_gflops\": %.3f, \"amx_int8_gops\": %.3f},\n"
               "  \"peer_libraries\": ",
            p->bf16_gflops, p->fp32_gflops, p->fp32_ymm_gflops, p->int8_gops, p->dram_gbps,
            p->amx_bf16_gflops,
            p->amx_int8_gops);
    bench_peers_json(f);
    fprintf(f, ",\n  \"cases\": [");
    for (int i = 0; i < n; ++i) {
        const result *r = &rs[i];
        fprintf(f, "%s\n    {\"name\": ", i ? "," : "");
        json_string(f, r->c->name);
        fprintf(f, ", \"shape\": ");
        json_string(f, r->w.shape);
        fprintf(f, ", \"ok\": %s", r->ok ? "true" : "false");
        if (!r->ok) {
            fprintf(f, ", \"error\": ");
            json_string(f, r->error);
        } else {
            fprintf(f, ", \"seconds\": %.6e, \"flops\": %.6e, \"bytes\": %.6e, \"gflops\": %.3f, "
                       "\"gbps\": %.3f, \"limit\": ",
                    r->seconds, r->w.flops, r->w.bytes, 1e-9 * r->w.flops / r->seconds,
                    1e-9 * r->w.bytes / r->seconds);
            json_string(f, r->limit_name ? r->limit_name : "");
            if (r->limit_pct >= 0)
                fprintf(f, ", \"limit_pct\": %.3f", r->limit_pct);
            else
                fprintf(f, ", \"limit_pct\": null");
            fprintf(f, ", \"calc_diff\": ");
            if (r->diff >= 0)
                fprintf(f, "%.6e", r->diff);
            else
                fprintf(f, "null");
            fprintf(f, ", \"peers\": [");
            for (int j = 0; j < r->npeers; ++j) {
                const bench_peer_result *q = &r->peers[j];
                fprintf(f, "%s{\"name\": ", j ? ", " : "");
                json_string(f, q->name);
                fprintf(f, ", \"ok\": %s", q->ok ? "true" : "false");
                if (q->ok)
                    fprintf(f, ", \"seconds\": %.6e, \"dequant_seconds\": %.6e, \"gflops\": %.3f, "
                               "\"ours_over_peer\": %.4f, \"calc_diff\": %.6e",
                            q->seconds, q->dequant_s, 1e-9 * r->w.flops / q->seconds, q->seconds / r->seconds,
                            q->diff);
                fprintf(f, ", \"note\": ");
                json_string(f, q->note);
                fputc('}', f);
            }
            fputc(']', f);
        }
        fputc('}', f);
    }
    fprintf(f, "\n  ]\n}\n");
    return fclose(f) == 0 ? 0 : -1;
}

/* tools/dgplot.py: $DGBENCH_PLOT_SCRIPT, else ../tools/ from the executable's directory (a build
 * directory inside the source tree) or from the current directory. */
static int find_plot_script(char *path, size_t size) {
    const char *env = getenv("DGBENCH_PLOT_SCRIPT");
    if (env && *env) {
        snprintf(path, size, "%s", env);
        return access(path, R_OK) == 0 ? 0 : -1;
    }
    char exe[4096];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            snprintf(path, size, "%s/../tools/dgplot.py", exe);
            if (access(path, R_OK) == 0)
                return 0;
        }
    }
    snprintf(path, size, "tools/dgplot.py");
    return access(path, R_OK) == 0 ? 0 : -1;
}

/* python3 dgplot.py JSON OUT; returns its exit status (127: not run). */
static int run_plot(const char *json, const char *out) {
    char script[4200];
    if (find_plot_script(script, sizeof script) != 0) {
        fprintf(stderr, "dgbench: cannot find tools/dgplot.py (set DGBENCH_PLOT_SCRIPT); draw it with: "
                        "python3 tools/dgplot.py %s %s\n", json, out);
        return 127;
    }
    char *args[] = {"python3", script, (char *)json, (char *)out, NULL};
    pid_t pid;
    if (posix_spawnp(&pid, "python3", NULL, NULL, args, environ) != 0) {
        fprintf(stderr, "dgbench: cannot run python3 for --plot\n");
        return 127;
    }
    int status = 0;
    if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status))
        return 127;
    return WEXITSTATUS(status);
}

int main(int argc, char **argv) {
    options o;
    if (parse_args(argc, argv, &o) != 0) {
        free(o.filters);
        return 2;
    }
    if (o.info) {
        print_info();
        free(o.filters);
        return 0;
    }
    int total = 0;
    for (int f = 0; f < NUM_FAMILIES; ++f)
        total += g_families[f]->count;
    if (o.list) {
        for (int f = 0; f < NUM_FAMILIES; ++f)
            for (int i = 0; i < g_families[f]->count; ++i)
                if (selected(&o, g_families[f]->cases[i].name))
                    printf("%s\n", g_families[f]->cases[i].name);
        free(o.filters);
        return 0;
    }
    int matches = 0;
    for (int f = 0; f < NUM_FAMILIES; ++f)
        for (int i = 0; i < g_families[f]->count; ++i)
            matches += selected(&o, g_families[f]->cases[i].name);
    if (matches == 0) {
        fprintf(stderr, "dgbench: no case matches the filter (see --list)\n");
        free(o.filters);
        return 2;
    }
    if (o.digest) {
        const bench_case **sel = calloc((size_t)total + 1, sizeof *sel);
        int n = 0;
        for (int f = 0; f < NUM_FAMILIES && sel; ++f)
            for (int i = 0; i < g_families[f]->count; ++i)
                if (selected(&o, g_families[f]->cases[i].name))
                    sel[n++] = &g_families[f]->cases[i];
        const int rc = sel ? bench_digest(sel, n, o.json, o.write_dir) : 1;
        free(sel);
        free(o.filters);
        return rc;
    }
    print_info();
    bench_peaks peaks;
    memset(&peaks, 0, sizeof peaks);
    if (!o.no_peaks) {
        bench_measure_peaks(&peaks, dg_get_num_sms(), o.quick);
        print_peaks(&peaks);
    }
    if (!o.no_peers)
        bench_peers_init(stdout);
    result *rs = calloc((size_t)total + 1, sizeof *rs);
    int n = 0, failed = 0;
    print_row_header(&peaks);
    for (int f = 0; f < NUM_FAMILIES; ++f)
        for (int i = 0; i < g_families[f]->count; ++i) {
            const bench_case *c = &g_families[f]->cases[i];
            if (!selected(&o, c->name))
                continue;
            result *r = &rs[n++];
            r->c = c;
            r->diff = -1;
            if (run_case(r, &o) != 0)
                ++failed;
            else
                rate_against_limits(r, &peaks);
            print_row(r);
            fflush(stdout);
        }
    printf("\n%d case(s), %d failed. time: best of the timed runs; %%lim: share of the larger of "
           "the compute and DRAM lower bounds; diff: calc_diff vs the reference backend "
           "(- when it is the default); peer: the same inputs through another library, ours/peer = "
           "its time over ours (> 1: we are faster).\n",
           n, failed);
    if (o.json && write_json(o.json, &peaks, rs, n, o.quick) != 0) {
        fprintf(stderr, "dgbench: cannot write %s\n", o.json);
        failed++;
    }
    if (o.plot) { /* from the JSON results: --json's file, or a temporary one */
        char tmp[4096] = "";
        const char *json = o.json;
        if (!json) {
            const char *dir = getenv("TMPDIR");
            snprintf(tmp, sizeof tmp, "%s/dgbench-plot-XXXXXX", dir && *dir ? dir : "/tmp");
            const int fd = mkstemp(tmp);
            if (fd >= 0)
                close(fd);
            json = fd >= 0 && write_json(tmp, &peaks, rs, n, o.quick) == 0 ? tmp : NULL;
        }
        if (!json || run_plot(json, o.plot) != 0) {
            fprintf(stderr, "dgbench: --plot did not draw %s\n", o.plot);
            failed++;
        }
        if (tmp[0])
            remove(tmp);
    }
    free(rs);
    free(o.filters);
    return failed ? 1 : 0;
}
