/*
 * dgbench_grouped.c - grouped GEMM cases (SPEC 4) on DeepGEMM's test shapes, each group's real
 * size drawn from 0.7x..1.3x of the expected size (fixed seed):
 *
 *   {bf16,fp8}_contig  index layout, each group padded to the contiguous alignment with -1 rows;
 *                      (G, M/group) = (4, 8192) and (8, 4096) on (N, K) = (4096, 7168), with
 *                      M/group scaled by 1/8 so that a run takes about a second
 *   {bf16,fp8}_masked  (G, expected_m) = (32, 192), (6, 1024) [compute-bound] and (32, 20),
 *                      (6, 20) [decoding: bound by reading the weights] on (N, K) = (7168, 3072);
 *                      max_m is trimmed to 1.3x expected (rows past masked_m are never read)
 *   {bf16,fp8}_masked_prepacked  the decoding shapes with the weights packed once at setup by
 *                      dg_pack_b_grouped (as an inference server packs its experts)
 *   fp8_fp4_masked[_prepacked]  the (32, 20) / (6, 20) decoding shapes with FP4 weights
 *                      (packed E2M1, power-of-two 1x32 scales) and FP8 activations
 *   k_{bf16,fp8}_tn    weight gradients, DeepGEMM's (G, M, N, K/group) = (4, 4096, 7168, 8192)
 *                      and (8, 7168, 2048, 4096) with K/group scaled by 1/8
 * FP8: A (activations) 1x128 float32 scales, B (weights) 128x128 float32 scales; k-grouped FP8
 * per-channel 1x128 scales along K. D is BF16 (k-grouped: float32).
 *
 * FLOPs count computed rows only. Bytes: every operand once; for the decoding cases that is
 * essentially the weights (B and its scales), which rotate through enough copies (> 1 GiB) that
 * every run reads them from DRAM, so GB/s is the weight bandwidth and %lim its share of the
 * measured DRAM limit. Prepacked cases rotate packed copies the same way and count the weight
 * bytes the run streams for the non-empty groups (packed_group_bytes: FP8 weights their kept
 * E4M3 codes on the AMX level, FP4 weights their decode panels on AVX-512 BF16 and their
 * nibble planes on AMX; else BF16 panels from AVX2 up, float32 panels below). The m20
 * decoding cases are rated like the dense ones, against the larger of the compute and DRAM
 * bounds: at 20 rows per expert a CPU without AMX is compute-bound (AVX2: 20 FMAs per weight).
 * diff: the reference backend computes a sample of rows (first and last computed row of the
 * first and last group) through the public API on sliced views; the engine run copies the same
 * rows out of D (a negligible part of the timed work).
 * --quick: N and K divided by 4, M (or K) per group by 8, decoding weights not rotated.
 * --digest (D hashed whole, one copy of the weights): contiguous N = 64, K = 896, M per group
 * expected / 128; masked N = 80, K = 384 (1.5 KC blocks, three 128-wide scale blocks), M per
 * group expected / 16 (at least 2: the decoding shapes stay at M <= 2); k-grouped M and N
 * divided by 64, K per group 320 before rounding to the alignment (so 256 to 512).
 */
#include "dgbench.h"

#include <stdio.h>
#include <string.h>

typedef enum gkind { G_CONTIG, G_MASKED, G_KGROUPED } gkind;

typedef struct gparams {
    gkind kind;
    int fp8, G, expected; /* fp8: 0 BF16, 1 FP8 weights, 2 FP4 weights (FP8 A); expected rows
                           * (k-grouped: K) per group, before scaling */
    int64_t m, n, k;      /* k-grouped: M, N of the gradient; else m unused */
    int scale_div;        /* expected is divided by this (see top) */
    int prepacked;        /* masked only: B packed once at setup (dg_pack_b_grouped) */
} gparams;

enum { SAMPLES = 4, COPIES_MAX = 8 };

typedef struct gstate {
    bench_pool pool; /* first: freed by bench_pool_state_free */
    const gparams *p;
    int64_t G, n, k, m, exp, copies, next;
    dg_tensor *a, *sfa, *b, *sfb, *d, *layout, *sample;
    dg_tensor *acol[2], *sfacol[2];   /* k-grouped: sampled columns of A as [sum_k, 1] */
    int32_t sizes[256];               /* rows (k-grouped: K) per group */
    int ks[256];
    int64_t rows[SAMPLES], groups[SAMPLES]; /* m-grouped: sampled D rows (masked: within group) */
    int nsample;
    dg_gemm_options o;
    dg_packed_b *pb[COPIES_MAX]; /* prepacked: identical packed copies of B, rotated */
    int npb;
} gstate;

static uint64_t g_seed; /* group sizes: bench_jitter's state, reset by every setup */

static double nb(const dg_tensor *t) { return t ? (double)dg_tensor_nbytes(t) : 0; }

static void grouped_free(void *state) {
    gstate *s = state;
    for (int i = 0; s && i < s->npb; ++i)
        dg_packed_b_free(s->pb[i]);
    bench_pool_state_free(state);
}

/* Bytes of one group's packed B that a decoding run reads (src/engine/prepack.h): FP8 weights
 * on the AMX level stream their kept E4M3 codes (1 byte each) and float32 scales per 128x128
 * block (the panels are for large M); otherwise the panels, N x K
 * values (BF16 pairs on AVX-512 / AMX levels, float32 below) and, for float32 scales that are not
 * powers of two (this tool's 0.5..2 uniform ones), one float per column and 128 of K. */
static double packed_group_bytes(const gstate *s) {
    const double kb = (double)((s->k + 127) / 128);
    /* decode panels (AVX-512 BF16) or nibble planes (AMX): codes, exponent bytes */
    if (s->p->fp8 == 2 && (dg_get_isa() == DG_ISA_AVX512_BF16 || dg_get_isa() >= DG_ISA_AMX))
        return (double)s->n * s->k / 2 + (double)s->n * (s->k / 32);
    if (s->p->fp8 == 2) /* BF16 panels, the power-of-two scales folded */
        return (double)s->n * s->k * (dg_get_isa() >= DG_ISA_AVX2 ? 2 : 4);
    if (s->p->fp8 && dg_get_isa() >= DG_ISA_AMX)
        return (double)s->n * s->k + (double)((s->n + 127) / 128) * kb * 4;
    const double es = dg_get_isa() >= DG_ISA_AVX2 ? 2 : 4; /* levels with a small-M path pack BF16 pairs */
    return (double)s->n * s->k * es + (s->sfb ? (double)s->n * kb * 4 : 0);
}

/* B [copies * G, N, K] (+ 128x128 scales; FP4: packed [.., N, K / 2] with power-of-two 1x32
 * scales, DeepSeek's FP4 weight recipe), copy 0 random, the others identical. */
static void setup_b(gstate *s) {
    const int64_t G = s->G * s->copies;
    const int fp4 = s->p->fp8 == 2;
    s->b = bench_pool_new(&s->pool, fp4 ? DG_FP4_E2M1X2 : s->p->fp8 ? DG_FLOAT8_E4M3 : DG_BFLOAT16, 3,
                          (int64_t[]){G, s->n, fp4 ? s->k / 2 : s->k});
    if (fp4)
        s->sfb = bench_pool_new(&s->pool, DG_FLOAT32, 3, (int64_t[]){G, s->n, (s->k + 31) / 32});
    else if (s->p->fp8)
        s->sfb = bench_pool_new(&s->pool, DG_FLOAT32, 3, (int64_t[]){G, (s->n + 127) / 128, (s->k + 127) / 128});
    if (s->pool.failed)
        return;
    dg_tensor b0 = *s->b, sf0 = s->sfb ? *s->sfb : b0;
    b0.shape[0] = sf0.shape[0] = s->G;
    bench_fill(&b0, 12, 1.0f);
    if (s->sfb && fp4) /* 2^-6 .. 2^-3 */
        for (int64_t i = 0; i < dg_tensor_numel(&sf0); ++i)
            ((float *)sf0.data)[i] = (float)(1 << (i * 7 % 4)) / 64;
    else if (s->sfb)
        bench_fill_uniform(&sf0, 14, 0.5f, 2.0f);
    for (int64_t c = 1; c < s->copies; ++c) {
        memcpy((char *)s->b->data + c * (size_t)nb(&b0), b0.data, (size_t)nb(&b0));
        if (s->sfb)
            memcpy((char *)s->sfb->data + c * (size_t)nb(&sf0), sf0.data, (size_t)nb(&sf0));
    }
}

/* The copy of B (and sfb) the next run uses (prepacked: the one copy; s->next rotates the
 * packed copies instead). */
static void b_copy(gstate *s, dg_tensor *b, dg_tensor *sfb) {
    const int64_t c = s->npb ? 0 : s->next;
    if (!s->npb)
        s->next = (s->next + 1) % s->copies;
    *b = *s->b;
    b->shape[0] = s->G;
    b->data = (char *)b->data + c * s->G * b->strides[0] * (int64_t)dg_dtype_size(b->dtype);
    if (s->sfb) {
        *sfb = *s->sfb;
        sfb->shape[0] = s->G;
        sfb->data = (char *)sfb->data + c * s->G * sfb->strides[0] * 4;
    }
}

/* Packs B (copy 0) into enough identical copies that rotating them overflows the caches
 * (> 1.1 GiB, as the unpacked decoding cases); w->bytes then counts packed weight bytes of the
 * non-empty groups instead of B as stored. */
static int setup_prepacked(gstate *s, int quick, bench_work *w) {
    const double group = packed_group_bytes(s);
    s->npb = quick ? 1 : (int)(1.1 * 1024 * 1024 * 1024 / (group * s->G)) + 1;
    s->npb = s->npb > COPIES_MAX ? COPIES_MAX : s->npb;
    dg_tensor b, sfb;
    b_copy(s, &b, &sfb);
    for (int i = 0; i < s->npb; ++i)
        if (dg_pack_b_grouped(&b, s->sfb ? &sfb : NULL, &s->o, &s->pb[i]) != DG_OK) {
            s->npb = i;
            return -1;
        }
    int nonempty = 0;
    for (int g = 0; g < s->G; ++g)
        nonempty += s->sizes[g] > 0;
    w->bytes += nonempty * group - (nb(s->b) + nb(s->sfb)) / s->copies;
    return 0;
}

static int setup_m(gstate *s, bench_work *w) {
    const gparams *p = s->p;
    const int masked = p->kind == G_MASKED;
    const int64_t align = dg_get_mk_alignment_for_contiguous_layout();
    int64_t total = 0, rows = 0, max_m = (s->exp * 13 + 9) / 10;
    for (int g = 0; g < s->G; ++g) {
        s->sizes[g] = (int32_t)bench_jitter(s->exp, &g_seed);
        rows += s->sizes[g];
        total += (s->sizes[g] + align - 1) / align * align;
    }
    const dg_dtype in = p->fp8 ? DG_FLOAT8_E4M3 : DG_BFLOAT16;
    const int64_t mrows = masked ? s->G * max_m : total;
    s->a = masked ? bench_pool_new(&s->pool, in, 3, (int64_t[]){s->G, max_m, s->k})
                  : bench_pool_new(&s->pool, in, 2, (int64_t[]){total, s->k});
    if (p->fp8)
        s->sfa = masked ? bench_pool_new(&s->pool, DG_FLOAT32, 3, (int64_t[]){s->G, max_m, (s->k + 127) / 128})
                        : bench_pool_new(&s->pool, DG_FLOAT32, 2, (int64_t[]){total, (s->k + 127) / 128});
    s->d = masked ? bench_pool_new(&s->pool, DG_BFLOAT16, 3, (int64_t[]){s->G, max_m, s->n})
                  : bench_pool_new(&s->pool, DG_BFLOAT16, 2, (int64_t[]){total, s->n});
    s->layout = bench_pool_new(&s->pool, DG_INT32, 1, (int64_t[]){masked ? s->G : total});
    s->sample = bench_pool_new(&s->pool, DG_BFLOAT16, 2, (int64_t[]){SAMPLES, s->n});
    setup_b(s);
    if (s->pool.failed)
        return -1;
    bench_fill(s->a, 11, 1.0f);
    if (p->fp8)
        bench_fill_uniform(s->sfa, 13, 0.5f, 2.0f);
    int32_t *lay = s->layout->data;
    for (int64_t g = 0, r0 = 0; g < s->G; ++g) {
        if (masked)
            lay[g] = s->sizes[g];
        else
            for (int64_t i = 0; i < (s->sizes[g] + align - 1) / align * align; ++i)
                lay[r0 + i] = i < s->sizes[g] ? (int32_t)g : -1;
        /* samples: first and last row of the first and the last group */
        if ((g == 0 || g == s->G - 1) && s->sizes[g] > 0 && s->nsample + 2 <= SAMPLES) {
            s->groups[s->nsample] = g, s->rows[s->nsample++] = masked ? 0 : r0;
            s->groups[s->nsample] = g, s->rows[s->nsample++] = (masked ? 0 : r0) + s->sizes[g] - 1;
        }
        r0 += (s->sizes[g] + align - 1) / align * align;
    }
    w->flops = 2.0 * (double)rows * (double)s->n * (double)s->k;
    w->bytes = nb(s->a) * rows / mrows + nb(s->sfa) * rows / mrows + (nb(s->b) + nb(s->sfb)) / s->copies +
               (double)rows * s->n * 2;
    snprintf(w->shape, sizeof w->shape, "g=%lld m=%lldx%lld n=%lld k=%lld", (long long)s->G, (long long)s->G,
             (long long)s->exp, (long long)s->n, (long long)s->k);
    return 0;
}

static int setup_k(gstate *s, bench_work *w) {
    const int fp8 = s->p->fp8;
    const int64_t align = dg_get_mk_alignment_for_contiguous_layout();
    int64_t sum_k = 0, sf_rows = 0;
    for (int g = 0; g < s->G; ++g) {
        s->ks[g] = (int)((bench_jitter(s->exp, &g_seed) + align - 1) / align * align);
        sum_k += s->ks[g];
        sf_rows += (s->ks[g] + 127) / 128;
    }
    const dg_dtype in = fp8 ? DG_FLOAT8_E4M3 : DG_BFLOAT16;
    s->a = bench_pool_new(&s->pool, in, 2, (int64_t[]){sum_k, s->m});
    s->b = bench_pool_new(&s->pool, in, 2, (int64_t[]){sum_k, s->n});
    s->d = bench_pool_new(&s->pool, DG_FLOAT32, 3, (int64_t[]){s->G, s->m, s->n});
    s->layout = bench_pool_new(&s->pool, DG_INT32, 1, (int64_t[]){s->G});
    s->sample = bench_pool_new(&s->pool, DG_FLOAT32, 3, (int64_t[]){2 * s->G, 1, s->n});
    if (fp8) {
        s->sfa = bench_pool_new(&s->pool, DG_FLOAT32, 2, (int64_t[]){sf_rows, s->m});
        s->sfb = bench_pool_new(&s->pool, DG_FLOAT32, 2, (int64_t[]){sf_rows, s->n});
    }
    for (int i = 0; i < 2; ++i) {
        s->acol[i] = bench_pool_new(&s->pool, in, 2, (int64_t[]){sum_k, 1});
        if (fp8)
            s->sfacol[i] = bench_pool_new(&s->pool, DG_FLOAT32, 2, (int64_t[]){sf_rows, 1});
    }
    if (s->pool.failed)
        return -1;
    bench_fill(s->a, 21, 1.0f);
    bench_fill(s->b, 22, 1.0f);
    if (fp8) {
        bench_fill_uniform(s->sfa, 23, 0.5f, 2.0f);
        bench_fill_uniform(s->sfb, 24, 0.5f, 2.0f);
    }
    const size_t es = dg_dtype_size(in);
    for (int i = 0; i < 2; ++i) { /* sampled gradient rows: 0 and M - 1 */
        const int64_t col = i ? s->m - 1 : 0;
        for (int64_t r = 0; r < sum_k; ++r)
            memcpy((char *)s->acol[i]->data + r * es, (char *)s->a->data + (r * s->m + col) * es, es);
        for (int64_t r = 0; fp8 && r < sf_rows; ++r)
            ((float *)s->sfacol[i]->data)[r] = ((float *)s->sfa->data)[r * s->m + col];
    }
    for (int g = 0; g < s->G; ++g)
        ((int32_t *)s->layout->data)[g] = s->ks[g];
    w->flops = 2.0 * (double)sum_k * (double)s->m * (double)s->n;
    w->bytes = nb(s->a) + nb(s->b) + nb(s->sfa) + nb(s->sfb) + nb(s->d);
    snprintf(w->shape, sizeof w->shape, "g=%lld m=%lld n=%lld k=%lldx%lld", (long long)s->G, (long long)s->m,
             (long long)s->n, (long long)s->G, (long long)s->exp);
    return 0;
}

static int grouped_setup(const bench_case *c, int size, bench_work *w) {
    const int quick = size != BENCH_SIZE_FULL;
    const gparams *p = c->params;
    gstate *s = bench_alloc(sizeof *s);
    if (!s)
        return -1;
    g_seed = 1234;
    s->p = p;
    s->G = p->G, s->m = p->m;
    s->n = quick ? p->n / 4 : p->n, s->k = quick ? p->k / 4 : p->k;
    s->exp = p->expected / p->scale_div / (quick ? 8 : 1);
    if (size == BENCH_SIZE_DIGEST) {
        if (p->kind == G_CONTIG)
            s->n = 64, s->k = 896, s->exp = p->expected / 128;
        else if (p->kind == G_MASKED)
            s->n = 80, s->k = 384, s->exp = p->expected / 16 > 2 ? p->expected / 16 : 2;
        else
            s->m = p->m / 64, s->n = p->n / 64, s->exp = 320;
    }
    if (s->exp < 1)
        s->exp = 1;
    s->o = dg_gemm_options_default();
    if (p->fp8 == 2) /* FP8 x FP4: A 1x128, B 1x32 */
        s->o.recipe_a[0] = 1, s->o.recipe_a[1] = 128, s->o.recipe_b[0] = 1, s->o.recipe_b[1] = 32;
    s->copies = 1;
    if (p->kind == G_MASKED && p->expected <= 64 && !quick && !p->prepacked) { /* decoding: weights from DRAM */
        const double bytes = (double)s->G * s->n * s->k * (p->fp8 == 2 ? 0.5 : p->fp8 ? 1 : 2);
        s->copies = (int64_t)(1.1 * 1024 * 1024 * 1024 / bytes) + 1;
        s->copies = s->copies > COPIES_MAX ? COPIES_MAX : s->copies;
    }
    int rc = p->kind == G_KGROUPED ? setup_k(s, w) : setup_m(s, w);
    if (rc == 0 && p->prepacked)
        rc = setup_prepacked(s, quick, w);
    if (rc != 0) {
        grouped_free(s);
        return -1;
    }
    w->state = s;
    w->rotation = (int)(s->npb > 0 ? s->npb : s->copies);
    w->out = *s->sample;
    w->digest[0] = *s->d, w->ndigest = 1;
    return 0;
}

/* ---- runs --------------------------------------------------------------------------------- */

static dg_status m_call(gstate *s, const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *b,
                        const dg_tensor *sfb, const dg_tensor *d, const dg_tensor *layout) {
    if (s->npb && dg_get_backend() != DG_BACKEND_REFERENCE) { /* masked on the next packed copy */
        const dg_packed_b *pb = s->pb[s->next];
        s->next = (s->next + 1) % s->npb;
        return s->p->fp8 ? dg_m_grouped_fp8_fp4_gemm_nt_masked_packed(a, sfa, pb, d, layout, (int)s->exp, &s->o)
                         : dg_m_grouped_bf16_gemm_nt_masked_packed(a, pb, d, layout, (int)s->exp, &s->o);
    }
    if (s->p->kind == G_MASKED && s->p->fp8 == 2)
        return dg_m_grouped_fp8_fp4_gemm_nt_masked(a, sfa, b, sfb, d, layout, (int)s->exp, &s->o);
    if (s->p->kind == G_MASKED)
        return s->p->fp8 ? dg_m_grouped_fp8_gemm_nt_masked(a, sfa, b, sfb, d, layout, (int)s->exp, &s->o)
                         : dg_m_grouped_bf16_gemm_nt_masked(a, b, d, layout, (int)s->exp, &s->o);
    return s->p->fp8 ? dg_m_grouped_fp8_gemm_nt_contiguous(a, sfa, b, sfb, d, layout, &s->o)
                     : dg_m_grouped_bf16_gemm_nt_contiguous(a, b, d, layout, &s->o);
}

/* t restricted to index `i` (length `len`) along dimension `dim`. */
static dg_tensor slice(const dg_tensor *t, int dim, int64_t i, int64_t len) {
    dg_tensor v = *t;
    v.data = (char *)t->data + i * t->strides[dim] * (int64_t)dg_dtype_size(t->dtype);
    v.shape[dim] = len;
    return v;
}

/* Reference backend: each sampled row alone, as a one-row problem. */
static dg_status m_reference(gstate *s, const dg_tensor *b, const dg_tensor *sfb) {
    const int masked = s->p->kind == G_MASKED;
    int32_t one = 1;
    for (int i = 0; i < s->nsample; ++i) {
        const int64_t g = s->groups[i], r = s->rows[i];
        dg_tensor a = *s->a, sfa = s->sfa ? *s->sfa : a, lay, d = slice(s->sample, 0, i, 1);
        dg_tensor bb = *b, sb = s->sfb ? *sfb : bb;
        if (masked) {
            a = slice(&a, 0, g, 1), a = slice(&a, 1, r, 1);
            sfa = slice(&sfa, 0, g, 1), sfa = slice(&sfa, 1, r, 1);
            bb = slice(&bb, 0, g, 1), sb = slice(&sb, 0, g, 1);
            lay = dg_tensor_make(&one, DG_INT32, 1, (int64_t[]){1});
            d = dg_tensor_make(d.data, DG_BFLOAT16, 3, (int64_t[]){1, 1, s->n});
        } else {
            a = slice(&a, 0, r, 1), sfa = slice(&sfa, 0, r, 1), lay = slice(s->layout, 0, r, 1);
        }
        const dg_status st = m_call(s, &a, s->sfa ? &sfa : NULL, &bb, s->sfb ? &sb : NULL, &d, &lay);
        if (st != DG_OK)
            return st;
    }
    return DG_OK;
}

static dg_status m_run(gstate *s) {
    dg_tensor b, sfb;
    b_copy(s, &b, &sfb);
    if (dg_get_backend() == DG_BACKEND_REFERENCE)
        return m_reference(s, &b, &sfb);
    const dg_status st = m_call(s, s->a, s->sfa, &b, s->sfb ? &sfb : NULL, s->d, s->layout);
    for (int i = 0; i < s->nsample && st == DG_OK; ++i) {
        const char *row = s->p->kind == G_MASKED ? (char *)s->d->data + (s->groups[i] * s->d->shape[1] + s->rows[i]) * s->n * 2
                                                 : (char *)s->d->data + s->rows[i] * s->n * 2;
        memcpy((char *)s->sample->data + i * s->n * 2, row, (size_t)s->n * 2);
    }
    return st;
}

static dg_status k_call(gstate *s, const dg_tensor *a, const dg_tensor *sfa, const dg_tensor *d) {
    return s->p->fp8 ? dg_k_grouped_fp8_gemm_tn_contiguous(a, sfa, s->b, s->sfb, d, s->ks, (int)s->G, s->layout,
                                                           NULL, &s->o)
                     : dg_k_grouped_bf16_gemm_tn_contiguous(a, s->b, d, s->ks, (int)s->G, s->layout, NULL, &s->o);
}

static dg_status k_run(gstate *s) {
    if (dg_get_backend() == DG_BACKEND_REFERENCE) { /* gradient rows 0 and M - 1 only */
        for (int i = 0; i < 2; ++i) {
            dg_tensor d = slice(s->sample, 0, i * s->G, s->G);
            const dg_status st = k_call(s, s->acol[i], s->sfacol[i], &d);
            if (st != DG_OK)
                return st;
        }
        return DG_OK;
    }
    const dg_status st = k_call(s, s->a, s->sfa, s->d);
    for (int64_t i = 0; i < 2 && st == DG_OK; ++i)
        for (int64_t g = 0; g < s->G; ++g)
            memcpy((float *)s->sample->data + (i * s->G + g) * s->n,
                   (float *)s->d->data + (g * s->m + (i ? s->m - 1 : 0)) * s->n, (size_t)s->n * 4);
    return st;
}

static dg_status grouped_run(void *state) {
    gstate *s = state;
    return s->p->kind == G_KGROUPED ? k_run(s) : m_run(s);
}

static const gparams P[] = {
    {G_CONTIG, 0, 4, 8192, 0, 4096, 7168, 8, 0},  {G_CONTIG, 0, 8, 4096, 0, 4096, 7168, 8, 0},
    {G_CONTIG, 1, 4, 8192, 0, 4096, 7168, 8, 0},  {G_CONTIG, 1, 8, 4096, 0, 4096, 7168, 8, 0},
    {G_MASKED, 0, 32, 192, 0, 7168, 3072, 1, 0},  {G_MASKED, 0, 6, 1024, 0, 7168, 3072, 1, 0},
    {G_MASKED, 0, 32, 20, 0, 7168, 3072, 1, 0},   {G_MASKED, 0, 6, 20, 0, 7168, 3072, 1, 0},
    {G_MASKED, 1, 32, 192, 0, 7168, 3072, 1, 0},  {G_MASKED, 1, 6, 1024, 0, 7168, 3072, 1, 0},
    {G_MASKED, 1, 32, 20, 0, 7168, 3072, 1, 0},   {G_MASKED, 1, 6, 20, 0, 7168, 3072, 1, 0},
    {G_KGROUPED, 0, 4, 8192, 4096, 7168, 0, 8, 0}, {G_KGROUPED, 0, 8, 4096, 7168, 2048, 0, 8, 0},
    {G_KGROUPED, 1, 4, 8192, 4096, 7168, 0, 8, 0}, {G_KGROUPED, 1, 8, 4096, 7168, 2048, 0, 8, 0},
    {G_MASKED, 0, 32, 20, 0, 7168, 3072, 1, 1}, {G_MASKED, 0, 6, 20, 0, 7168, 3072, 1, 1},
    {G_MASKED, 1, 32, 20, 0, 7168, 3072, 1, 1}, {G_MASKED, 1, 6, 20, 0, 7168, 3072, 1, 1},
    {G_MASKED, 2, 32, 20, 0, 7168, 3072, 1, 0}, {G_MASKED, 2, 32, 20, 0, 7168, 3072, 1, 1},
    {G_MASKED, 2, 6, 20, 0, 7168, 3072, 1, 1},
};

#define CASE(name, lim, i) {name, lim, &P[i], grouped_setup, grouped_run, grouped_free}
static const bench_case CASES[] = {
    CASE("grouped/bf16_contig/g4_m8192div8_n4096_k7168", BENCH_LIMIT_BF16, 0),
    CASE("grouped/bf16_contig/g8_m4096div8_n4096_k7168", BENCH_LIMIT_BF16, 1),
    CASE("grouped/fp8_contig/g4_m8192div8_n4096_k7168", BENCH_LIMIT_BF16, 2),
    CASE("grouped/fp8_contig/g8_m4096div8_n4096_k7168", BENCH_LIMIT_BF16, 3),
    CASE("grouped/bf16_masked/g32_m192_n7168_k3072", BENCH_LIMIT_BF16, 4),
    CASE("grouped/bf16_masked/g6_m1024_n7168_k3072", BENCH_LIMIT_BF16, 5),
    CASE("grouped/bf16_masked/g32_m20_n7168_k3072", BENCH_LIMIT_BF16, 6),
    CASE("grouped/bf16_masked/g6_m20_n7168_k3072", BENCH_LIMIT_BF16, 7),
    CASE("grouped/fp8_masked/g32_m192_n7168_k3072", BENCH_LIMIT_BF16, 8),
    CASE("grouped/fp8_masked/g6_m1024_n7168_k3072", BENCH_LIMIT_BF16, 9),
    CASE("grouped/fp8_masked/g32_m20_n7168_k3072", BENCH_LIMIT_BF16, 10),
    CASE("grouped/fp8_masked/g6_m20_n7168_k3072", BENCH_LIMIT_BF16, 11),
    CASE("grouped/bf16_masked_prepacked/g32_m20_n7168_k3072", BENCH_LIMIT_BF16, 16),
    CASE("grouped/bf16_masked_prepacked/g6_m20_n7168_k3072", BENCH_LIMIT_BF16, 17),
    CASE("grouped/fp8_masked_prepacked/g32_m20_n7168_k3072", BENCH_LIMIT_BF16, 18),
    CASE("grouped/fp8_masked_prepacked/g6_m20_n7168_k3072", BENCH_LIMIT_BF16, 19),
    CASE("grouped/fp8_fp4_masked/g32_m20_n7168_k3072", BENCH_LIMIT_BF16, 20),
    CASE("grouped/fp8_fp4_masked_prepacked/g32_m20_n7168_k3072", BENCH_LIMIT_BF16, 21),
    CASE("grouped/fp8_fp4_masked_prepacked/g6_m20_n7168_k3072", BENCH_LIMIT_BF16, 22),
    CASE("grouped/k_bf16_tn/g4_m4096_n7168_k8192div8", BENCH_LIMIT_BF16, 12),
    CASE("grouped/k_bf16_tn/g8_m7168_n2048_k4096div8", BENCH_LIMIT_BF16, 13),
    CASE("grouped/k_fp8_tn/g4_m4096_n7168_k8192div8", BENCH_LIMIT_BF16, 14),
    CASE("grouped/k_fp8_tn/g8_m7168_n2048_k4096div8", BENCH_LIMIT_BF16, 15),
};
#undef CASE

const bench_family bench_family_grouped = {"grouped", CASES, sizeof CASES / sizeof CASES[0]};
