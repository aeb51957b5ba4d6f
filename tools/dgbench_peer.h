/*
 * dgbench_peer.h - other libraries timed on a case's own inputs in the same run (peers).
 *
 * A case that has a peer fills a bench_peer_gemm in setup() (pointing into its own buffers)
 * and sets bench_work.peer; dgbench.c times every peer found on this system on it after the
 * case's own runs. Peers are loaded with dlopen at run time, so dgbench neither builds nor
 * runs against them; a missing peer is reported once and skipped.
 *
 * Each library is the file named by its variable, else the first of its names that the
 * loader finds, else the first in a Python environment's lib directory ($VIRTUAL_ENV,
 * $CONDA_PREFIX, the prefixes and user base of the python3 on PATH, /usr/local), which is
 * where `pip install onednn-cpu-gomp mkl` puts them.
 *
 *   oneDNN    libdnnl.so.3 or libdnnl.so.2 ($DGBENCH_ONEDNN): dnnl_matmul with BF16 inputs.
 *             Plain B: the weights memory in the user's layout (repacked by oneDNN inside
 *             each call, as our unpacked GEMM repacks). Pre-packed: the weights in the layout
 *             oneDNN picks (format_tag any), reordered once before timing. Where it has no
 *             BF16 matmul (oneDNN 3.2 on AVX2-only CPUs) it runs in FP32 with FP32 D: BF16
 *             weights widened once at setup, A in every run ("+widen f32").
 *   MKL       libmkl_rt.so.3 / .so.2 ($DGBENCH_MKL): cblas_gemm_bf16bf16f32 for BF16 inputs,
 *             cblas_sgemm for FLOAT32; pre-packed B through their _pack / _compute. FP32 D.
 *             GNU OpenMP threading layer unless MKL_THREADING_LAYER is set (one OpenMP
 *             runtime with oneDNN's); MKL_ENABLE_INSTRUCTIONS is MKL's own.
 *   OpenBLAS  libopenblas.so.0 ($DGBENCH_OPENBLAS): cblas_sbgemm for BF16 inputs where the
 *             build exports it (Debian's 0.3.21 does not), cblas_sgemm for FLOAT32 inputs;
 *             plain B only. FP32 D.
 * FP8 / FP4 inputs (oneDNN, MKL): the chain a user would otherwise run, a plain C
 * dequantization to the peer's input type (timed) and then its GEMM; pre-packed weights are
 * dequantized and packed once before timing, so only A is dequantized in the timed part.
 * Peers run on dg_get_num_sms() threads (omp_set_num_threads through oneDNN's handle,
 * mkl_set_num_threads, openblas_set_num_threads). When DG_ISA caps the library below the
 * CPU's best level, ONEDNN_MAX_CPU_ISA and MKL_ENABLE_INSTRUCTIONS are set to the same level
 * unless already set.
 */
#ifndef DGBENCH_PEER_H
#define DGBENCH_PEER_H

#include "dgbench.h"

#include <stdio.h>

/* One operand as the case stores it: logical [rows, K] (A: rows = M, B: rows = N). */
typedef struct bench_peer_operand {
    const dg_tensor *t;  /* BFLOAT16, FLOAT32, FLOAT8_E4M3 or FP4_E2M1X2 (K packed in pairs) */
    int mn_major;        /* stored [K, rows] (DeepGEMM's nn/tn/tt); BF16 / FLOAT32 only */
    const dg_tensor *sf; /* FP8 / FP4 only: FLOAT32 or packed UE8M0 INT32, [rows/gran_mn, K/gran_k] */
    int gran_mn, gran_k; /* elements sharing one scale along rows and K */
} bench_peer_operand;

/* D [m, n] = A @ B^T, as the case computes it. */
typedef struct bench_peer_gemm {
    int64_t m, n, k;
    bench_peer_operand a;
    bench_peer_operand b;   /* b.t points at nb identical copies (b.t[0 .. nb-1]) */
    int nb;
    int copies;             /* pre-packed: distinct packed copies rotated per run (>= 1) */
    int prepacked;          /* our case uses pre-packed B: compare with pre-packed weights */
    dg_dtype d_dtype;       /* BFLOAT16 or FLOAT32 */
    const int64_t *rows;    /* the case's `out` holds these rows of D (NULL: all of D) */
    int nrows;
} bench_peer_gemm;

#define BENCH_PEER_MAX 3

typedef struct bench_peer_result {
    char name[64];     /* e.g. "onednn 2.6.3 plain" */
    int ok;
    double seconds;    /* best of the timed runs of the whole chain */
    double dequant_s;  /* part of `seconds` spent dequantizing (0 when none) */
    double diff;       /* calc_diff against our output (< 0: not computed) */
    char note[96];     /* error or remark */
} bench_peer_result;

/* Looks for the peer libraries once; prints one line saying what was found or missing. */
void bench_peers_init(FILE *f);
/* A JSON object describing the peer libraries found (for --json). */
void bench_peers_json(FILE *f);
/* Times every available peer on g (warm-up, then up to `reps` runs within `budget` seconds);
 * `ours` is the case's output as float (compared with each peer's D). Returns the number of
 * results written (0 when no peer applies). */
int bench_peers_run(const bench_peer_gemm *g, const float *ours, int reps, double budget,
                    bench_peer_result *out);

#endif
