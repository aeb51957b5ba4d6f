/*
 * dgbench_gemm.c - dense GEMM cases (SPEC 3): D = A @ B^T on DeepSeek's (N, K) shapes.
 *
 *   bf16_<layout>  A, B BF16 (nt, and nn/tn/tt as DeepGEMM's transposed views); D BF16
 *   fp8_nt_1d2d    A E4M3 with 1x128 float32 scales, B E4M3 with 128x128 float32 scales; D BF16
 *   fp8_nt_ue8m0   A, B E4M3 with 1x128 scales packed as UE8M0 (int32); D BF16
 *   fp8_fp4_nt     A E4M3 with 1x128 scales, B packed FP4 with 1x32 UE8M0-valued float32
 *                  scales (DeepGEMM's FP8 x FP4 quant config (128, 32)); D BF16
 *   fp4_fp4_nt     A and B packed FP4, 1x32 UE8M0-valued float32 scales; D BF16. Integer dot
 *                  products (src/engine/fp4x4.h): rated against the INT8 peak
 *   *_nt_prepacked the same with B pre-packed by dg_pack_b at setup (decoding: the weights are
 *                  packed once); one packed copy per B copy, rotated like B. Bytes count B as
 *                  stored: what these small-M runs read on the AMX level (BF16 panels for BF16
 *                  B; for FP8 B its kept E4M3 codes and float32 scales of sfb's size, see
 *                  src/engine/prepack.h). Below AMX FP8 B is read as BF16 panels (AVX-512
 *                  levels) or float32 ones (AVX2 / portable), so GB/s there is "GB/s of B".
 *
 * Large M (4096) is compute-bound: its limit is the BF16 dot-product peak of the library's ISA
 * level (AMX tiles on isa amx; else VDPBF16PS, or FP32 FMA where that is faster; see
 * compute_peak in dgbench.c). Small M (1, 16, 64: decoding) is bound by
 * reading B; those cases rotate through enough copies of B (> 2x the last-level cache) that
 * every run reads its weights from DRAM, as decoding does.
 *
 * diff: the reference backend is ~0.2 GFLOPS, so it computes only a sample of rows (the first
 * and last two) through the public API on row-sliced views; `out` holds just those rows (the
 * engine's run copies them out of D, a negligible part of the timed work).
 * --quick uses m_quick and N, K divided by 4 (rounded up to 128). --digest: large-M cases
 * M = 263 (past every level's small-M limit, over two MC tiles, a tail of MR), N = 48; small-M
 * cases their M with N = 200 (decode items of 16 rows and a tail); K = 896 (7168) or 640
 * (3.5 and 2.5 KC blocks, several 128-wide scale blocks); one copy of B; D hashed whole.
 * Timing includes everything the public call does (argument checks, packing).
 * Bytes counted: A, B and their scales read once, D written once.
 * Peers (dgbench_peer.h) run every case on the same operands, B copies and sampled rows;
 * *_prepacked cases against the peer's pre-packed weights.
 */
#include "dgbench.h"
#include "dgbench_peer.h"

#include <stdio.h>
#include <string.h>

typedef enum gemm_kind { GEMM_BF16, GEMM_FP8_1D2D, GEMM_FP8_UE8M0, GEMM_FP8_FP4, GEMM_FP4_FP4 } gemm_kind;
enum { LAYOUT_NT, LAYOUT_NN, LAYOUT_TN, LAYOUT_TT };
#define SAMPLE_MAX 4
#define B_COPIES_MAX 320 /* enough for the smallest B (FP4, 7 MiB) against a 1 GiB rotation */

typedef struct gemm_params {
    gemm_kind kind;
    int layout;
    int64_t m, n, k, m_quick;
    int prepacked; /* B packed once at setup (dg_pack_b), nt only */
} gemm_params;

typedef struct gemm_state {
    const gemm_params *p;
    int64_t m, n, k;
    dg_tensor a, sfa, b[B_COPIES_MAX], sfb, d, sample;
    dg_packed_b *pb[B_COPIES_MAX];
    int nb, next_b, nsample, npb, size;
    int64_t rows[SAMPLE_MAX];
    dg_gemm_options opts;
    bench_peer_gemm peer; /* this GEMM for oneDNN / OpenBLAS (dgbench_peer.h) */
} gemm_state;

static void gemm_free(void *s) {
    gemm_state *st = s;
    if (!st)
        return;
    bench_tensor_free(&st->a);
    bench_tensor_free(&st->sfa);
    for (int i = 0; i < st->nb; ++i)
        bench_tensor_free(&st->b[i]);
    for (int i = 0; i < st->npb; ++i)
        dg_packed_b_free(st->pb[i]);
    bench_tensor_free(&st->sfb);
    bench_tensor_free(&st->d);
    bench_tensor_free(&st->sample);
    bench_free(st);
}

static int64_t quarter(int64_t x) {
    const int64_t q = (x / 4 + 127) / 128 * 128;
    return q < 128 ? 128 : q;
}

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Packs float32 powers of two [rows, s] into UE8M0 int32 [rows, ceil(s / 4)] (bytes little-endian). */
static dg_tensor pack_ue8m0(const float *sf, int64_t rows, int64_t s) {
    dg_tensor t = bench_tensor2(DG_INT32, rows, cdiv(s, 4));
    if (!t.data)
        return t;
    uint32_t *w = t.data;
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t q = 0; q < cdiv(s, 4); ++q) {
            uint32_t word = 0;
            for (int j = 0; j < 4 && 4 * q + j < s; ++j)
                word |= (uint32_t)dg_float_to_ue8m0(sf[i * s + 4 * q + j]) << (8 * j);
            w[i * cdiv(s, 4) + q] = word;
        }
    return t;
}

/* Quantizes x [rows, cols] into t / sf as the case's recipe says (always [rows, cols] order). */
static int quantize(const float *x, int64_t rows, int64_t cols, gemm_kind kind, int is_b, dg_tensor *t,
                    dg_tensor *sf) {
    if (kind == GEMM_BF16) {
        *t = bench_tensor2(DG_BFLOAT16, rows, cols);
        if (t->data)
            bench_to_bf16(x, t->data, (size_t)(rows * cols));
        return t->data ? 0 : -1;
    }
    if ((is_b && kind == GEMM_FP8_FP4) || kind == GEMM_FP4_FP4) {
        *t = bench_tensor2(DG_FP4_E2M1X2, rows, cols / 2);
        *sf = bench_tensor2(DG_FLOAT32, rows, cdiv(cols, 32));
        if (!t->data || !sf->data)
            return -1;
        bench_cast_fp4_rows(x, rows, cols, 32, 1, t->data, sf->data);
        return 0;
    }
    *t = bench_tensor2(DG_FLOAT8_E4M3, rows, cols);
    if (is_b && kind == GEMM_FP8_1D2D) { /* FP8 weights: 128 x 128 blocks */
        *sf = bench_tensor2(DG_FLOAT32, cdiv(rows, 128), cdiv(cols, 128));
        if (!t->data || !sf->data)
            return -1;
        bench_cast_fp8_block(x, rows, cols, 128, 0, t->data, sf->data);
        return 0;
    }
    /* 1 x 128 per row; UE8M0 cases (and FP8 x FP4 activations) round scales to powers of two */
    const int ue8m0 = kind == GEMM_FP8_UE8M0 || kind == GEMM_FP8_FP4;
    dg_tensor f = bench_tensor2(DG_FLOAT32, rows, cdiv(cols, 128));
    if (!t->data || !f.data) {
        bench_tensor_free(&f);
        return -1;
    }
    bench_cast_fp8_rows(x, rows, cols, 128, ue8m0, t->data, f.data);
    if (kind != GEMM_FP8_UE8M0) {
        *sf = f;
        return 0;
    }
    *sf = pack_ue8m0(f.data, rows, cdiv(cols, 128));
    bench_tensor_free(&f);
    return sf->data ? 0 : -1;
}

/* Enough copies of B that rotating through them overflows the last-level cache twice over
 * (small M only; large M reads B many times per run anyway). The cache size is what the OS
 * reports (32 MiB assumed when unknown); the copies are capped at 2 GiB in all. */
static int b_copies(int64_t m, double b_bytes) {
    if (m > 64)
        return 1;
    size_t llc = bench_llc_bytes();
    if (llc == 0)
        llc = (size_t)32 << 20;
    double want = 2.0 * (double)llc;
    if (want > 2.0 * 1024 * 1024 * 1024)
        want = 2.0 * 1024 * 1024 * 1024;
    const int nb = (int)(want / b_bytes) + 1;
    return nb < 2 ? 2 : nb > B_COPIES_MAX ? B_COPIES_MAX : nb;
}

/* BF16 [r, c] -> a new contiguous [c, r] copy (the MN-major storage of nn/tn/tt operands). */
static int transpose_copy(dg_tensor *t) {
    dg_tensor u = bench_tensor2(DG_BFLOAT16, t->shape[1], t->shape[0]);
    if (!u.data)
        return -1;
    const uint16_t *src = t->data;
    uint16_t *dst = u.data;
    for (int64_t i = 0; i < t->shape[0]; ++i)
        for (int64_t j = 0; j < t->shape[1]; ++j)
            dst[j * t->shape[0] + i] = src[i * t->shape[1] + j];
    bench_tensor_free(t);
    *t = u;
    return 0;
}

static const int kTransA[4] = {0, 0, 1, 1}, kTransB[4] = {0, 1, 1, 0};

static int gemm_alloc_io(gemm_state *st, const gemm_params *p, float *x) {
    const int64_t m = st->m, n = st->n, k = st->k;
    bench_fill_normal(x, (size_t)(m * k), 1, 1.0f);
    if (quantize(x, m, k, p->kind, 0, &st->a, &st->sfa) != 0)
        return -1;
    bench_fill_normal(x, (size_t)(n * k), 2, 1.0f);
    if (quantize(x, n, k, p->kind, 1, &st->b[0], &st->sfb) != 0)
        return -1;
    if (kTransA[p->layout] && transpose_copy(&st->a) != 0)
        return -1;
    if (kTransB[p->layout] && transpose_copy(&st->b[0]) != 0)
        return -1;
    st->nb = st->size == BENCH_SIZE_DIGEST ? 1 : b_copies(p->m, (double)dg_tensor_nbytes(&st->b[0]));
    for (int i = 1; i < st->nb; ++i) { /* identical copies: every run computes the same D */
        st->b[i] = bench_tensor2(st->b[0].dtype, st->b[0].shape[0], st->b[0].shape[1]);
        if (!st->b[i].data)
            return -1;
        memcpy(st->b[i].data, st->b[0].data, (size_t)dg_tensor_nbytes(&st->b[0]));
    }
    st->d = bench_tensor2(DG_BFLOAT16, m, n);
    st->nsample = m < SAMPLE_MAX ? (int)m : SAMPLE_MAX;
    for (int i = 0; i < st->nsample; ++i)
        st->rows[i] = i < st->nsample / 2 ? i : m - st->nsample + i;
    st->sample = bench_tensor2(DG_BFLOAT16, st->nsample, n);
    return st->d.data && st->sample.data ? 0 : -1;
}

/* Packs every B copy, then keeps only b[0] (the reference backend's sample rows use it). */
static int prepack(gemm_state *st) {
    const dg_tensor *sfb = st->sfb.data ? &st->sfb : NULL;
    for (int i = 0; i < st->nb; ++i, ++st->npb)
        if (dg_pack_b(&st->b[i], sfb, &st->opts, &st->pb[i]) != DG_OK)
            return -1;
    for (int i = 1; i < st->nb; ++i)
        bench_tensor_free(&st->b[i]);
    st->nb = 1;
    return 0;
}

/* The case's GEMM for the peers: same operands, B copies, sampled rows. Scale blocks follow
 * the recipe (FP8 x FP4's options) or DeepGEMM's defaults: A 1 x 128, B 1 x 128 or, for
 * FP8 1D2D weights, 128 x 128. */
static void fill_peer(gemm_state *st) {
    bench_peer_gemm *g = &st->peer;
    g->m = st->m, g->n = st->n, g->k = st->k;
    g->a.t = &st->a, g->b.t = st->b, g->nb = st->nb;
    g->a.mn_major = kTransA[st->p->layout], g->b.mn_major = kTransB[st->p->layout];
    g->a.sf = st->sfa.data ? &st->sfa : NULL, g->b.sf = st->sfb.data ? &st->sfb : NULL;
    g->a.gran_mn = 1, g->a.gran_k = st->opts.recipe_a[1] ? st->opts.recipe_a[1] : 128;
    g->b.gran_mn = st->p->kind == GEMM_FP8_1D2D ? 128 : 1;
    g->b.gran_k = st->opts.recipe_b[1] ? st->opts.recipe_b[1] : 128;
    g->prepacked = st->npb > 0, g->copies = st->npb;
    g->d_dtype = st->d.dtype;
    g->rows = st->rows, g->nrows = st->nsample;
}

static int gemm_setup(const bench_case *c, int size, bench_work *w) {
    const gemm_params *p = c->params;
    gemm_state *st = bench_alloc(sizeof *st);
    if (!st)
        return -1;
    st->p = p, st->size = size;
    const int quick = size != BENCH_SIZE_FULL;
    st->m = quick ? p->m_quick : p->m, st->n = quick ? quarter(p->n) : p->n, st->k = quick ? quarter(p->k) : p->k;
    if (size == BENCH_SIZE_DIGEST) {
        const int large = p->m > 256;
        st->m = large ? 263 : p->m, st->n = large ? 48 : 200;
        st->k = p->k >= 4096 ? 896 : p->k >= 2048 ? 640 : 528;
    }
    st->opts = dg_gemm_options_default();
    if (p->kind == GEMM_FP8_FP4 || p->kind == GEMM_FP4_FP4) {
        st->opts.recipe_a[0] = 1, st->opts.recipe_a[1] = p->kind == GEMM_FP4_FP4 ? 32 : 128;
        st->opts.recipe_b[0] = 1, st->opts.recipe_b[1] = 32;
    }
    float *x = bench_alloc_uninit((size_t)((st->m > st->n ? st->m : st->n) * st->k) * sizeof(float));
    int rc = x ? gemm_alloc_io(st, p, x) : -1;
    bench_free(x);
    if (rc == 0 && p->prepacked)
        rc = prepack(st);
    if (rc != 0) {
        gemm_free(st);
        return -1;
    }
    w->state = st;
    w->rotation = st->npb ? st->npb : st->nb;
    w->out = st->sample;
    w->digest[0] = st->d, w->ndigest = 1;
    fill_peer(st);
    w->peer = &st->peer;
    w->flops = 2.0 * (double)st->m * (double)st->n * (double)st->k;
    w->bytes = (double)(dg_tensor_nbytes(&st->a) + dg_tensor_nbytes(&st->b[0]) + dg_tensor_nbytes(&st->sfa) +
                        dg_tensor_nbytes(&st->sfb) + dg_tensor_nbytes(&st->d));
    snprintf(w->shape, sizeof w->shape, "m=%lld n=%lld k=%lld", (long long)st->m, (long long)st->n,
             (long long)st->k);
    return 0;
}

/* The layout's entry point on the stored operands (A [K, M] for tn/tt, B [K, N] for nn/tn). */
static dg_status call(const gemm_state *st, const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                      const dg_tensor *d) {
    switch (st->p->kind) {
    case GEMM_BF16:
        switch (st->p->layout) {
        case LAYOUT_NN: return dg_bf16_gemm_nn(a, b, d, NULL);
        case LAYOUT_TN: return dg_bf16_gemm_tn(a, b, d, NULL);
        case LAYOUT_TT: return dg_bf16_gemm_tt(a, b, d, NULL);
        default: return dg_bf16_gemm_nt(a, b, d, NULL);
        }
    case GEMM_FP8_1D2D:
    case GEMM_FP8_UE8M0:
        return dg_fp8_gemm_nt(a, sfa, b, &st->sfb, d, NULL, &st->opts);
    case GEMM_FP8_FP4:
    case GEMM_FP4_FP4:
        return dg_fp8_fp4_gemm_nt(a, sfa, b, &st->sfb, d, NULL, &st->opts);
    }
    return DG_ERR_INTERNAL;
}

static dg_status gemm_run(void *s) {
    gemm_state *st = s;
    const int nrot = st->npb ? st->npb : st->nb, ib = st->next_b;
    const dg_tensor *b = &st->b[st->npb ? 0 : ib];
    st->next_b = (st->next_b + 1) % nrot;
    const int64_t es = 2; /* D is BF16 */
    if (dg_get_backend() == DG_BACKEND_REFERENCE) { /* sample rows only (see top) */
        for (int i = 0; i < st->nsample; ++i) {
            const int64_t r = st->rows[i];
            dg_tensor a = st->a, sfa = st->sfa, d = st->sample;
            const int ad = kTransA[st->p->layout]; /* the dimension of A indexing M */
            a.data = (char *)a.data + r * a.strides[ad] * (int64_t)dg_dtype_size(a.dtype);
            a.shape[ad] = 1;
            if (sfa.data) {
                sfa.data = (char *)sfa.data + r * sfa.strides[0] * 4;
                sfa.shape[0] = 1;
            }
            d.data = (char *)d.data + i * d.strides[0] * es;
            d.shape[0] = 1;
            const dg_status stt = call(st, &a, &sfa, b, &d);
            if (stt != DG_OK)
                return stt;
        }
        return DG_OK;
    }
    const dg_status stt = !st->npb                        ? call(st, &st->a, &st->sfa, b, &st->d)
                          : st->p->kind == GEMM_BF16 ? dg_bf16_gemm_nt_packed(&st->a, st->pb[ib], &st->d, NULL)
                          : dg_fp8_fp4_gemm_nt_packed(&st->a, &st->sfa, st->pb[ib], &st->d, NULL, &st->opts);
    for (int i = 0; i < st->nsample && stt == DG_OK; ++i)
        memcpy((char *)st->sample.data + i * st->sample.strides[0] * es,
               (char *)st->d.data + st->rows[i] * st->d.strides[0] * es, (size_t)(st->n * es));
    return stt;
}

/* DeepSeek's (N, K) shapes from DeepGEMM's tests (SPEC 3). */
#define SHAPE(kind, layout, m, n, k) {kind, layout, m, n, k, m < 64 ? m : 64, 0}
#define PACKED(kind, m, n, k) {kind, LAYOUT_NT, m, n, k, m, 1}
static const gemm_params P[] = {
    SHAPE(GEMM_BF16, LAYOUT_NT, 4096, 2112, 7168),     SHAPE(GEMM_BF16, LAYOUT_NT, 4096, 24576, 1536),
    SHAPE(GEMM_BF16, LAYOUT_NT, 4096, 7168, 2048),     SHAPE(GEMM_BF16, LAYOUT_NN, 4096, 2112, 7168),
    SHAPE(GEMM_BF16, LAYOUT_TN, 4096, 2112, 7168),     SHAPE(GEMM_BF16, LAYOUT_TT, 4096, 2112, 7168),
    SHAPE(GEMM_BF16, LAYOUT_NT, 1, 2112, 7168),        SHAPE(GEMM_BF16, LAYOUT_NT, 16, 2112, 7168),
    SHAPE(GEMM_BF16, LAYOUT_NT, 64, 2112, 7168),       SHAPE(GEMM_FP8_1D2D, LAYOUT_NT, 4096, 2112, 7168),
    SHAPE(GEMM_FP8_1D2D, LAYOUT_NT, 4096, 7168, 2048), SHAPE(GEMM_FP8_UE8M0, LAYOUT_NT, 4096, 2112, 7168),
    SHAPE(GEMM_FP8_FP4, LAYOUT_NT, 4096, 2112, 7168),  SHAPE(GEMM_FP8_FP4, LAYOUT_NT, 1, 7168, 2048),
    SHAPE(GEMM_FP8_1D2D, LAYOUT_NT, 16, 2112, 7168),
    PACKED(GEMM_BF16, 1, 2112, 7168),                  PACKED(GEMM_BF16, 16, 2112, 7168),
    PACKED(GEMM_BF16, 64, 2112, 7168),                 PACKED(GEMM_FP8_1D2D, 16, 2112, 7168),
    SHAPE(GEMM_FP4_FP4, LAYOUT_NT, 4096, 2112, 7168),  SHAPE(GEMM_FP4_FP4, LAYOUT_NT, 1, 7168, 2048),
    PACKED(GEMM_FP8_FP4, 1, 7168, 2048),               PACKED(GEMM_FP8_FP4, 16, 7168, 2048),
    SHAPE(GEMM_FP8_1D2D, LAYOUT_NT, 1, 2112, 7168),    PACKED(GEMM_FP8_1D2D, 1, 2112, 7168),
    /* DeepSeek-V3's o_proj (128 heads x 128): rows 16 KiB apart, which crowd L1's sets */
    SHAPE(GEMM_FP8_1D2D, LAYOUT_NT, 1, 7168, 16384),
};
#undef SHAPE
#undef PACKED

#define CASE(name, i) {name, BENCH_LIMIT_BF16, &P[i], gemm_setup, gemm_run, gemm_free}
static const bench_case CASES[] = {
    CASE("gemm/bf16_nt/n2112_k7168", 0),        CASE("gemm/bf16_nt/n24576_k1536", 1),
    CASE("gemm/bf16_nt/n7168_k2048", 2),        CASE("gemm/bf16_nn/n2112_k7168", 3),
    CASE("gemm/bf16_tn/n2112_k7168", 4),        CASE("gemm/bf16_tt/n2112_k7168", 5),
    CASE("gemm/bf16_nt/m1_n2112_k7168", 6),     CASE("gemm/bf16_nt/m16_n2112_k7168", 7),
    CASE("gemm/bf16_nt/m64_n2112_k7168", 8),    CASE("gemm/fp8_nt_1d2d/n2112_k7168", 9),
    CASE("gemm/fp8_nt_1d2d/n7168_k2048", 10),   CASE("gemm/fp8_nt_ue8m0/n2112_k7168", 11),
    CASE("gemm/fp8_fp4_nt/n2112_k7168", 12),    CASE("gemm/fp8_fp4_nt/m1_n7168_k2048", 13),
    CASE("gemm/fp8_nt_1d2d/m16_n2112_k7168", 14),
    CASE("gemm/bf16_nt_prepacked/m1_n2112_k7168", 15),
    CASE("gemm/bf16_nt_prepacked/m16_n2112_k7168", 16),
    CASE("gemm/bf16_nt_prepacked/m64_n2112_k7168", 17),
    CASE("gemm/fp8_nt_1d2d_prepacked/m16_n2112_k7168", 18),
    {"gemm/fp4_fp4_nt/n2112_k7168", BENCH_LIMIT_INT8, &P[19], gemm_setup, gemm_run, gemm_free},
    {"gemm/fp4_fp4_nt/m1_n7168_k2048", BENCH_LIMIT_INT8, &P[20], gemm_setup, gemm_run, gemm_free},
    CASE("gemm/fp8_fp4_nt_prepacked/m1_n7168_k2048", 21),
    CASE("gemm/fp8_fp4_nt_prepacked/m16_n7168_k2048", 22),
    CASE("gemm/fp8_nt_1d2d/m1_n2112_k7168", 23),
    CASE("gemm/fp8_nt_1d2d_prepacked/m1_n2112_k7168", 24),
    CASE("gemm/fp8_nt_1d2d/m1_n7168_k16384", 25),
};
#undef CASE

const bench_family bench_family_gemm = {"gemm", CASES, sizeof CASES / sizeof CASES[0]};
