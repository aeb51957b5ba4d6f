/*
 * test_mega_moe.c - the mega MoE references (SPEC 9) against an independent per-token formula:
 * loop over each rank's tokens, for every slot run the expert MLP directly on dequantized
 * weights (the test's own FP4/FP8 decoding and scale indexing), quantize the activation the
 * documented way, sum the slots. Same order and roundings -> compared bitwise; against
 * unrounded double math -> calc_diff. Also: the combine order, dispatch order, recv stats,
 * clamp on/off, both variants, and bad inputs leaving outputs untouched.
 */
#include "test_util.h"

#include "reference/ref_mega_moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the test's own number handling ---------------------------------------------------------- */

static float bf16r(float v) { return dg_bf16_to_float(dg_float_to_bf16(v)); }

static float t_pow2_ceil(float x) { /* ceil_to_ue8m0, written from the SPEC */
    float ax = fabsf(x);
    uint32_t bits;
    memcpy(&bits, &ax, 4);
    int e = (int)((bits >> 23) & 0xff) + ((bits & 0x7fffff) != 0);
    e = e < 1 ? 1 : e > 254 ? 254 : e;
    const uint32_t ob = (uint32_t)e << 23;
    float r;
    memcpy(&r, &ob, 4);
    return r;
}

static uint8_t t_exp_byte(float pow2) {
    uint32_t bits;
    memcpy(&bits, &pow2, 4);
    return (uint8_t)(bits >> 23);
}

/* Per 1x32 scale of v[0, n): amax clamped at 1e-4, divided by the format's max, power of two. */
static float t_group_sf(const float *v, int64_t n, float fmt_max) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; ++i)
        amax = fabsf(v[i]) > amax ? fabsf(v[i]) : amax;
    return t_pow2_ceil((amax < 1e-4f ? 1e-4f : amax) / fmt_max);
}

/* The documented step 4 on one activation row (FP8 E4M3, per 32, UE8M0). */
static void t_quant_act(const float *a, int64_t n, float *out) {
    for (int64_t g = 0; g < n; g += 32) {
        const int64_t len = n - g < 32 ? n - g : 32;
        const float sf = t_group_sf(a + g, len, 448.0f);
        for (int64_t i = g; i < g + len; ++i)
            out[i] = dg_e4m3_to_float(dg_float_to_e4m3(a[i] * (1.0f / sf))) * sf;
    }
}

/* A [1, a, b] tensor seen as [a, b]. */
static dg_tensor t_drop0(dg_tensor t) {
    t.ndim = 2;
    t.shape[0] = t.shape[1], t.shape[1] = t.shape[2];
    t.strides[0] = t.strides[1], t.strides[1] = t.strides[2];
    return t;
}

/*
 * Scales sfv[G][rows][groups] (powers of two) stored as: mode 0 FLOAT32 [G, rows, groups];
 * mode 1 INT32 packed K-major [G, rows, ceil(groups/4)]; mode 2 the same values MN-major (a
 * transposed view of [G, ceil(groups/4), rows] storage). grouped = 0 drops the G dimension.
 */
static dg_tensor t_make_sf(const float *sfv, int64_t G, int64_t rows, int64_t groups, int mode, int grouped) {
    const int64_t packed = (groups + 3) / 4;
    dg_tensor t;
    if (mode == 0) {
        t = tu_alloc3(DG_FLOAT32, G, rows, groups);
        memcpy(t.data, sfv, (size_t)(G * rows * groups) * sizeof(float));
    } else {
        t = mode == 1 ? tu_alloc3(DG_INT32, G, rows, packed) : tu_alloc3(DG_INT32, G, packed, rows);
        uint32_t *w = t.data;
        for (int64_t g = 0; g < G; ++g)
            for (int64_t r = 0; r < rows; ++r)
                for (int64_t s = 0; s < groups; ++s) {
                    const int64_t q = s / 4;
                    const int64_t off = mode == 1 ? (g * rows + r) * packed + q : (g * packed + q) * rows + r;
                    w[off] |= (uint32_t)t_exp_byte(sfv[(g * rows + r) * groups + s]) << (8 * (s % 4));
                }
        if (mode == 2)
            t = dg_tensor_transpose(t, 1, 2);
    }
    return grouped ? t : t_drop0(t);
}

/* Quantizes v [rows, K] (G groups stacked) per 1x32: FP8 (fmt 8) or packed FP4 (fmt 4). deq gets
 * the dequantized values, sfv the scales [rows, ceil(K/32)]. Returns the data tensor. */
static dg_tensor t_quantize(const float *v, int64_t G, int64_t rows, int64_t K, int fmt, float *deq, float *sfv) {
    const int64_t groups = (K + 31) / 32;
    dg_tensor d = fmt == 8 ? tu_alloc3(DG_FLOAT8_E4M3, G, rows, K) : tu_alloc3(DG_FP4_E2M1X2, G, rows, K / 2);
    uint8_t *bytes = d.data;
    for (int64_t r = 0; r < G * rows; ++r)
        for (int64_t s = 0; s < groups; ++s) {
            const int64_t k0 = s * 32, len = K - k0 < 32 ? K - k0 : 32;
            const float sf = t_group_sf(v + r * K + k0, len, fmt == 8 ? 448.0f : 6.0f);
            sfv[r * groups + s] = sf;
            for (int64_t k = k0; k < k0 + len; ++k) {
                const float x = v[r * K + k] * (1.0f / sf);
                if (fmt == 8) {
                    bytes[r * K + k] = dg_float_to_e4m3(x);
                    deq[r * K + k] = dg_e4m3_to_float(bytes[r * K + k]) * sf;
                } else {
                    const uint8_t code = dg_float_to_e2m1(x) & 15;
                    bytes[r * (K / 2) + k / 2] |= (uint8_t)(k % 2 ? code << 4 : code);
                    deq[r * K + k] = dg_e2m1_to_float(code) * sf;
                }
            }
        }
    return d;
}

/* ---- problem generation ------------------------------------------------------------------------ */

#define MAX_RANKS 4

typedef struct cfg {
    int R, E, K;
    int64_t H, I;
    int64_t T[MAX_RANKS];
    int fp8, idx64;
    int empty_expert;           /* an expert no token selects (-1: none) */
    int sf_mode[MAX_RANKS];     /* weight scale layout per rank (t_make_sf modes) */
    int x_sf_mode[MAX_RANKS];   /* 0 FLOAT32 or 1 packed */
    uint64_t seed;
} cfg;

typedef struct rank_data {
    dg_tensor x, x_sf, idx, w, l1, l1_sf, l2, l2_sf, y, stats;
    float *x_deq, *l1_deq, *l2_deq; /* [T, H], [E/R, 2I, H], [E/R, H, I] dequantized */
    int32_t stats0[64];
} rank_data;

static int64_t t_idx(const cfg *c, const rank_data *d, int64_t t, int64_t j) {
    return c->idx64 ? ((const int64_t *)d->idx.data)[t * c->K + j] : ((const int32_t *)d->idx.data)[t * c->K + j];
}

/* Random top-k: K distinct experts (never c->empty_expert), about a quarter masked to -1 with
 * weight 0 (as DeepGEMM's test masks), rank 0 token 0 fully masked, rank 0 token 1 slots 0 and 1
 * kept with weights 1e-7 (activations below the 1e-4 amax floor) and 0 (an all-zero row). */
static void t_make_topk(tu_rng *rng, const cfg *c, int r, rank_data *d) {
    const int64_t T = c->T[r];
    d->idx = tu_alloc2(c->idx64 ? DG_INT64 : DG_INT32, T, c->K);
    d->w = tu_alloc2(DG_FLOAT32, T, c->K);
    float *w = d->w.data;
    for (int64_t t = 0; t < T; ++t)
        for (int j = 0; j < c->K; ++j) {
            int64_t e;
            bool again;
            do {
                e = tu_randint(rng, 0, c->E - 1);
                again = e == c->empty_expert;
                for (int i = 0; i < j; ++i)
                    again = again || t_idx(c, d, t, i) == e;
            } while (again);
            float wt = (float)(0.2 + tu_uniform(rng));
            if ((r == 0 && t == 0) || tu_uniform(rng) < 0.25)
                e = -1, wt = 0.0f;
            if (r == 0 && t == 1 && j < 2)
                wt = j == 0 ? 1e-7f : 0.0f;
            if (c->idx64)
                ((int64_t *)d->idx.data)[t * c->K + j] = e;
            else
                ((int32_t *)d->idx.data)[t * c->K + j] = (int32_t)e;
            w[t * c->K + j] = wt;
        }
}

/* BF16-rounded normal values [n] (DeepGEMM's test draws BF16 tensors). */
static float *t_randn(tu_rng *rng, size_t n) {
    float *v = malloc(n * sizeof(float));
    tu_fill_normal(rng, v, n, 1.0f);
    for (size_t i = 0; i < n; ++i)
        v[i] = bf16r(v[i]);
    return v;
}

static dg_tensor t_bf16_tensor(const float *v, int64_t G, int64_t rows, int64_t cols) {
    dg_tensor t = tu_alloc3(DG_BFLOAT16, G, rows, cols);
    for (int64_t i = 0; i < G * rows * cols; ++i)
        ((uint16_t *)t.data)[i] = dg_float_to_bf16(v[i]);
    return t;
}

/* One weight tensor [G, rows, cols] of rank r: FP4 + scales, or BF16. */
static void t_make_weight(tu_rng *rng, const cfg *c, int r, int64_t G, int64_t rows, int64_t cols,
                          dg_tensor *w, dg_tensor *sf, float **deq) {
    float *v = t_randn(rng, (size_t)(G * rows * cols));
    *deq = malloc((size_t)(G * rows * cols) * sizeof(float));
    if (c->fp8) {
        float *sfv = malloc((size_t)(G * rows * ((cols + 31) / 32)) * sizeof(float));
        *w = t_quantize(v, G, rows, cols, 4, *deq, sfv);
        *sf = t_make_sf(sfv, G, rows, (cols + 31) / 32, c->sf_mode[r], 1);
        free(sfv);
    } else {
        *w = t_bf16_tensor(v, G, rows, cols);
        memcpy(*deq, v, (size_t)(G * rows * cols) * sizeof(float));
        sf->data = NULL;
    }
    free(v);
}

static void t_make_rank(tu_rng *rng, const cfg *c, int r, rank_data *d) {
    memset(d, 0, sizeof *d);
    const int64_t T = c->T[r], H = c->H, I = c->I, epr = c->E / c->R;
    float *x = t_randn(rng, (size_t)(T * H));
    d->x_deq = malloc((size_t)(T * H + 1) * sizeof(float));
    if (c->fp8) {
        float *sfv = malloc((size_t)(T * ((H + 31) / 32) + 1) * sizeof(float));
        d->x = t_drop0(t_quantize(x, 1, T, H, 8, d->x_deq, sfv));
        d->x_sf = t_make_sf(sfv, 1, T, (H + 31) / 32, c->x_sf_mode[r], 0);
        free(sfv);
    } else {
        d->x = t_drop0(t_bf16_tensor(x, 1, T, H));
        memcpy(d->x_deq, x, (size_t)(T * H) * sizeof(float));
    }
    free(x);
    t_make_topk(rng, c, r, d);
    t_make_weight(rng, c, r, epr, 2 * I, H, &d->l1, &d->l1_sf, &d->l1_deq);
    t_make_weight(rng, c, r, epr, H, I, &d->l2, &d->l2_sf, &d->l2_deq);
    d->y = tu_alloc2(DG_BFLOAT16, T, H);
    tu_fill_bytes(&d->y, 0x7f); /* a sentinel the reference must overwrite everywhere */
    d->stats = tu_alloc(DG_INT32, 1, &epr);
    for (int64_t e = 0; e < epr; ++e)
        d->stats0[e] = ((int32_t *)d->stats.data)[e] = (int32_t)tu_randint(rng, 0, 99);
}

static void t_free_rank(rank_data *d) {
    dg_tensor *ts[] = {&d->x, &d->x_sf, &d->idx, &d->w, &d->l1, &d->l1_sf, &d->l2, &d->l2_sf, &d->y, &d->stats};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; ++i)
        if (ts[i]->data)
            tu_free(ts[i]);
    free(d->x_deq);
    free(d->l1_deq);
    free(d->l2_deq);
}

/* Calls the variant of c with every rank's tensors. */
static dg_status t_call(const cfg *c, rank_data *d, float clamp, int with_stats) {
    const dg_tensor *x[MAX_RANKS], *xs[MAX_RANKS], *idx[MAX_RANKS], *w[MAX_RANKS], *l1[MAX_RANKS],
        *l1s[MAX_RANKS], *l2[MAX_RANKS], *l2s[MAX_RANKS], *y[MAX_RANKS], *st[MAX_RANKS];
    for (int r = 0; r < c->R; ++r) {
        x[r] = &d[r].x, xs[r] = &d[r].x_sf, idx[r] = &d[r].idx, w[r] = &d[r].w;
        l1[r] = &d[r].l1, l1s[r] = &d[r].l1_sf, l2[r] = &d[r].l2, l2s[r] = &d[r].l2_sf;
        y[r] = &d[r].y, st[r] = &d[r].stats;
    }
    if (c->fp8)
        return dg_fp8_fp4_mega_moe_reference(c->R, c->E, x, xs, idx, w, l1, l1s, l2, l2s, y,
                                             with_stats ? st : NULL, clamp);
    return dg_bf16_mega_moe_reference(c->R, c->E, x, idx, w, l1, l2, y, with_stats ? st : NULL, clamp);
}

/* ---- the independent per-token formula ------------------------------------------------------- */

/*
 * Token t of rank r: y_bits as documented (same roundings and order, so bitwise comparable) and
 * ideal = the same MoE in double without any intermediate rounding or activation quantization.
 */
static void t_naive_token(const cfg *c, const rank_data *d, float clamp, int r, int64_t t, uint16_t *y_bits,
                          double *ideal) {
    const int64_t H = c->H, I = c->I, K = c->K, epr = c->E / c->R;
    const int has_clamp = !isinf(clamp);
    const float cb = has_clamp ? bf16r(clamp) : clamp;
    float *acc = calloc((size_t)H, sizeof(float)), *h = malloc((size_t)(2 * I) * sizeof(float));
    float *a = malloc((size_t)I * sizeof(float)), *aq = malloc((size_t)I * sizeof(float));
    double *hd = malloc((size_t)(2 * I) * sizeof(double)), *ad = malloc((size_t)I * sizeof(double));
    const float *xr = d[r].x_deq + t * H;
    for (int64_t i = 0; i < H; ++i)
        ideal[i] = 0.0;
    for (int64_t j = 0; j < K; ++j) {
        const int64_t e = t_idx(c, &d[r], t, j);
        if (e < 0)
            continue;
        const rank_data *own = &d[e / epr];
        const int64_t le = e % epr;
        const float wt = ((const float *)d[r].w.data)[t * K + j];
        for (int64_t n = 0; n < 2 * I; ++n) {
            const float *wr = own->l1_deq + (le * 2 * I + n) * H;
            double s = 0.0;
            for (int64_t k = 0; k < H; ++k)
                s += (double)xr[k] * (double)wr[k];
            hd[n] = s;
            h[n] = bf16r((float)s);
        }
        for (int64_t i = 0; i < I; ++i) {
            float g = h[i], u = h[I + i];
            double gd = hd[i], ud = hd[I + i];
            if (has_clamp) {
                g = g < cb ? g : cb;
                u = u < -cb ? -cb : (u > cb ? cb : u);
                gd = gd < clamp ? gd : clamp;
                ud = ud < -clamp ? -clamp : (ud > clamp ? clamp : ud);
            }
            a[i] = ((g / (1.0f + expf(-g))) * u) * wt;
            ad[i] = gd / (1.0 + exp(-gd)) * ud * wt;
        }
        if (c->fp8)
            t_quant_act(a, I, aq);
        else
            for (int64_t i = 0; i < I; ++i)
                aq[i] = bf16r(a[i]);
        for (int64_t col = 0; col < H; ++col) {
            const float *wr = own->l2_deq + (le * H + col) * I;
            double s = 0.0, sd = 0.0;
            for (int64_t i = 0; i < I; ++i) {
                s += (double)aq[i] * (double)wr[i];
                sd += ad[i] * (double)wr[i];
            }
            acc[col] += bf16r((float)s);
            ideal[col] += sd;
        }
    }
    for (int64_t col = 0; col < H; ++col)
        y_bits[col] = dg_float_to_bf16(acc[col]);
    free(acc), free(h), free(a), free(aq), free(hd), free(ad);
}

/* Calls the reference on fresh outputs and checks y (bitwise and calc_diff) and the stats.
 * Returns a malloc'ed copy of every rank's y bits, concatenated. */
static uint16_t *t_check(const cfg *c, rank_data *d, float clamp, double max_diff, const char *label) {
    const int64_t H = c->H, epr = c->E / c->R;
    int64_t total = 0;
    for (int r = 0; r < c->R; ++r) {
        tu_fill_bytes(&d[r].y, 0x7f);
        memcpy(d[r].stats.data, d[r].stats0, (size_t)epr * sizeof(int32_t));
        total += c->T[r] * H;
    }
    TU_CHECK_OK(t_call(c, d, clamp, 1));
    uint16_t *all = malloc((size_t)(total + 1) * sizeof(uint16_t)), *want = malloc((size_t)H * sizeof(uint16_t));
    float *got_f = malloc((size_t)(total + 1) * sizeof(float)), *ideal_f = malloc((size_t)(total + 1) * sizeof(float));
    double *ideal = malloc((size_t)H * sizeof(double));
    int64_t mism = 0, pos = 0, first = -1;
    int64_t recv[MAX_RANKS * 64] = {0};
    for (int r = 0; r < c->R; ++r)
        for (int64_t t = 0; t < c->T[r]; ++t) {
            t_naive_token(c, d, clamp, r, t, want, ideal);
            for (int64_t j = 0; j < c->K; ++j)
                if (t_idx(c, &d[r], t, j) >= 0)
                    ++recv[t_idx(c, &d[r], t, j)];
            for (int64_t col = 0; col < H; ++col, ++pos) {
                const uint16_t got = ((const uint16_t *)d[r].y.data)[t * H + col];
                all[pos] = got;
                got_f[pos] = dg_bf16_to_float(got);
                ideal_f[pos] = (float)ideal[col];
                if (got != want[col] && mism++ == 0)
                    first = pos;
            }
        }
    TU_CHECK(mism == 0, "%s: %lld of %lld y values differ from the per-token formula (first at %lld)", label,
             (long long)mism, (long long)total, (long long)first);
    const double diff = tu_calc_diff(got_f, ideal_f, (size_t)total);
    TU_CHECK(diff < max_diff, "%s: calc_diff against unrounded math %.3g >= %.3g", label, diff, max_diff);
    for (int r = 0; r < c->R; ++r)
        for (int64_t e = 0; e < epr; ++e) {
            const int32_t got = ((const int32_t *)d[r].stats.data)[e];
            TU_CHECK(got == d[r].stats0[e] + recv[r * epr + e], "%s: recv stats rank %d expert %lld: %d, want %d",
                     label, r, (long long)e, got, (int)(d[r].stats0[e] + recv[r * epr + e]));
        }
    if (c->empty_expert >= 0)
        TU_CHECK(recv[c->empty_expert] == 0, "%s: expert %d should receive nothing", label, c->empty_expert);
    free(want), free(got_f), free(ideal_f), free(ideal);
    return all;
}

/* ---- whole-chain cases ----------------------------------------------------------------------- */

static int64_t t_total(const cfg *c) {
    int64_t n = 0;
    for (int r = 0; r < c->R; ++r)
        n += c->T[r] * c->H;
    return n;
}

static void run_case(const cfg *c, double max_diff, const char *name) {
    tu_rng rng = {c->seed};
    rank_data d[MAX_RANKS];
    for (int r = 0; r < c->R; ++r)
        t_make_rank(&rng, c, r, &d[r]);
    char label[96];
    snprintf(label, sizeof label, "%s, no clamp", name);
    uint16_t *y_none = t_check(c, d, INFINITY, max_diff, label);
    snprintf(label, sizeof label, "%s, clamp 10", name);
    uint16_t *y_10 = t_check(c, d, 10.0f, max_diff, label);
    /* 2.3 is not a BF16 value: the clamp uses BF16(2.3) = 2.296875, as the fused kernel does. */
    snprintf(label, sizeof label, "%s, clamp 2.3", name);
    uint16_t *y_23 = t_check(c, d, 2.3f, max_diff, label);
    const size_t bytes = (size_t)t_total(c) * sizeof(uint16_t);
    TU_CHECK(memcmp(y_none, y_10, bytes) != 0 && memcmp(y_10, y_23, bytes) != 0,
             "%s: the clamp must change the result", name);

    /* Deterministic, and without stats the same y with the counters left alone. */
    for (int r = 0; r < c->R; ++r)
        memcpy(d[r].stats.data, d[r].stats0, sizeof(int32_t) * (size_t)(c->E / c->R));
    TU_CHECK_OK(t_call(c, d, 10.0f, 0));
    int64_t pos = 0;
    int same = 1, stats_same = 1;
    for (int r = 0; r < c->R; ++r) {
        same &= memcmp(d[r].y.data, y_10 + pos, (size_t)(c->T[r] * c->H) * sizeof(uint16_t)) == 0;
        stats_same &= memcmp(d[r].stats.data, d[r].stats0, sizeof(int32_t) * (size_t)(c->E / c->R)) == 0;
        pos += c->T[r] * c->H;
    }
    TU_CHECK(same, "%s: a second call (without stats) gives other bits", name);
    TU_CHECK(stats_same, "%s: stats == NULL must leave the counters alone", name);
    free(y_none), free(y_10), free(y_23);
    for (int r = 0; r < c->R; ++r)
        t_free_rank(&d[r]);
}

static void test_chains(void) {
    /* FP8 x FP4, 2 ranks, uneven tokens, expert 5 unused; weight scales packed K-major on rank 0
     * and MN-major (TMA-aligned view) on rank 1; x scales packed and float32. */
    cfg a = {.R = 2, .E = 8, .K = 3, .H = 128, .I = 64, .T = {5, 17}, .fp8 = 1, .idx64 = 1,
             .empty_expert = 5, .sf_mode = {1, 2}, .x_sf_mode = {1, 0}, .seed = 11};
    run_case(&a, 1e-3, "fp8 R2");
    /* 4 ranks, a rank without tokens, int32 top-k, float32 weight scales on rank 2, H and I not
     * multiples of 32 (partial last scale groups). */
    cfg b = {.R = 4, .E = 8, .K = 3, .H = 240, .I = 80, .T = {9, 0, 13, 4}, .fp8 = 1, .idx64 = 0,
             .empty_expert = 2, .sf_mode = {2, 1, 0, 2}, .x_sf_mode = {1, 1, 0, 1}, .seed = 12};
    run_case(&b, 1e-3, "fp8 R4");
    cfg c = {.R = 2, .E = 8, .K = 3, .H = 128, .I = 64, .T = {6, 11}, .fp8 = 0, .idx64 = 1,
             .empty_expert = 0, .seed = 13};
    run_case(&c, 5e-5, "bf16 R2");
    cfg e = {.R = 4, .E = 8, .K = 2, .H = 96, .I = 80, .T = {3, 8, 0, 5}, .fp8 = 0, .idx64 = 0,
             .empty_expert = 7, .seed = 14};
    run_case(&e, 5e-5, "bf16 R4");
}

/* ---- the shared combine order and the dispatch order ----------------------------------------- */

static void test_combine_row(void) {
    /* Slots in order [1, 2^-24, 2^-24, 2^-8]: float32 from +0 gives 1 + 2^-8, a BF16 tie -> 1.0.
     * In the reverse order the small terms survive (1 + 2^-8 + 2^-23) and BF16 rounds up. */
    const float v[4] = {1.0f, 0x1p-24f, 0x1p-24f, 0x1p-8f};
    uint16_t rows[4][2], y[2];
    for (int j = 0; j < 4; ++j)
        rows[j][0] = dg_float_to_bf16(v[j]), rows[j][1] = dg_float_to_bf16(v[3 - j]);
    const uint16_t *slots[5] = {rows[0], NULL, rows[1], rows[2], rows[3]};
    dg_mega_moe_combine_row(slots, 5, 2, y);
    TU_CHECK(y[0] == 0x3f80, "combine in slot order: got 0x%04x, want 0x3f80", y[0]);
    TU_CHECK(y[1] == 0x3f81, "combine of the reversed slots: got 0x%04x, want 0x3f81", y[1]);
    /* A single -0 slot gives +0 (the sum starts at +0); no slot gives +0. */
    const uint16_t neg0[2] = {0x8000, 0x8000};
    const uint16_t *one[2] = {NULL, neg0};
    dg_mega_moe_combine_row(one, 2, 2, y);
    TU_CHECK(y[0] == 0 && y[1] == 0, "combine of -0: 0x%04x", y[0]);
    const uint16_t *none[2] = {NULL, NULL};
    y[0] = 0x1234;
    dg_mega_moe_combine_row(none, 2, 1, y);
    TU_CHECK(y[0] == 0, "combine without slots: 0x%04x", y[0]);
}

static void test_dispatch_order(void) {
    /* 2 ranks x 3 tokens x 2 slots over 4 experts. */
    int32_t i0[6] = {3, 0, -1, 3, 1, 0}, i1[6] = {0, 3, -1, -1, 3, 0};
    dg_tensor t0 = dg_tensor_2d(i0, DG_INT32, 3, 2), t1 = dg_tensor_2d(i1, DG_INT32, 3, 2);
    const dg_tensor *idx[2] = {&t0, &t1};
    const int64_t tokens[2] = {3, 3};
    dg_mega_moe_problem p = {.num_ranks = 2, .num_experts = 4, .experts_per_rank = 2, .topk = 2,
                             .num_tokens = tokens, .topk_idx = idx};
    TU_CHECK(dg_ref_mega_moe_num_slots(&p) == 12, "slot count");
    int64_t off[5];
    dg_mega_moe_pair pairs[12];
    dg_ref_mega_moe_dispatch(&p, off, pairs);
    const int64_t want_off[5] = {0, 4, 5, 5, 9};
    TU_CHECK(memcmp(off, want_off, sizeof off) == 0, "offsets %lld %lld %lld %lld %lld", (long long)off[0],
             (long long)off[1], (long long)off[2], (long long)off[3], (long long)off[4]);
    /* Expert 0: (r0,t0,s1) (r0,t2,s1) (r1,t0,s0) (r1,t2,s1); expert 3: (r0,t0,s0) (r0,t1,s1)
     * (r1,t0,s1) (r1,t2,s0); expert 1: (r0,t2,s0). */
    const int want[9][3] = {{0, 0, 1}, {0, 2, 1}, {1, 0, 0}, {1, 2, 1}, {0, 2, 0},
                            {0, 0, 0}, {0, 1, 1}, {1, 0, 1}, {1, 2, 0}};
    int ok = 1;
    for (int i = 0; i < 9; ++i)
        ok &= pairs[i].rank == want[i][0] && pairs[i].token == want[i][1] && pairs[i].slot == want[i][2];
    TU_CHECK(ok, "dispatch order is (source rank, token, slot) within each expert");
}

/* ---- bad inputs ------------------------------------------------------------------------------ */

typedef struct call_args {
    int R, E;
    const dg_tensor *x[2], *xs[2], *idx[2], *w[2], *l1[2], *l1s[2], *l2[2], *l2s[2], *y[2], *st[2];
    int no_x, no_xs, no_l2s, no_st; /* pass NULL instead of that array */
    float clamp;
} call_args;

static call_args t_args(rank_data *d) {
    call_args a = {.R = 2, .E = 8, .clamp = 10.0f};
    for (int r = 0; r < 2; ++r) {
        a.x[r] = &d[r].x, a.xs[r] = &d[r].x_sf, a.idx[r] = &d[r].idx, a.w[r] = &d[r].w;
        a.l1[r] = &d[r].l1, a.l1s[r] = &d[r].l1_sf, a.l2[r] = &d[r].l2, a.l2s[r] = &d[r].l2_sf;
        a.y[r] = &d[r].y, a.st[r] = &d[r].stats;
    }
    return a;
}

/* Runs one bad call: the status, the argument named in the message, all outputs untouched. */
static void t_expect_fail(int fp8, const call_args *a, rank_data *d, dg_status want, const char *arg, const char *what) {
    void *snap[4] = {tu_snapshot(&d[0].y), tu_snapshot(&d[1].y), tu_snapshot(&d[0].stats), tu_snapshot(&d[1].stats)};
    const dg_tensor *const *x = a->no_x ? NULL : a->x, *const *st = a->no_st ? NULL : a->st;
    const dg_status s =
        fp8 ? dg_fp8_fp4_mega_moe_reference(a->R, a->E, x, a->no_xs ? NULL : a->xs, a->idx, a->w, a->l1, a->l1s,
                                            a->l2, a->no_l2s ? NULL : a->l2s, a->y, st, a->clamp)
            : dg_bf16_mega_moe_reference(a->R, a->E, x, a->idx, a->w, a->l1, a->l2, a->y, st, a->clamp);
    TU_CHECK(s == want, "%s: got %s, want %s (%s)", what, dg_status_string(s), dg_status_string(want), dg_last_error());
    TU_CHECK(strstr(dg_last_error(), arg) != NULL, "%s: message should name '%s': %s", what, arg, dg_last_error());
    TU_CHECK(strstr(dg_last_error(), fp8 ? "dg_fp8_fp4_mega_moe_reference" : "dg_bf16_mega_moe_reference") != NULL,
             "%s: message should name the function: %s", what, dg_last_error());
    TU_CHECK(tu_unchanged(&d[0].y, snap[0]) && tu_unchanged(&d[1].y, snap[1]) &&
                 tu_unchanged(&d[0].stats, snap[2]) && tu_unchanged(&d[1].stats, snap[3]),
             "%s: outputs were written", what);
    for (int i = 0; i < 4; ++i)
        free(snap[i]);
}

static void test_bad_fp8(void) {
    cfg c = {.R = 2, .E = 8, .K = 3, .H = 128, .I = 64, .T = {5, 7}, .fp8 = 1, .idx64 = 1,
             .empty_expert = -1, .sf_mode = {1, 2}, .x_sf_mode = {1, 1}, .seed = 21};
    tu_rng rng = {c.seed};
    rank_data d[2];
    for (int r = 0; r < 2; ++r)
        t_make_rank(&rng, &c, r, &d[r]);
    call_args a = t_args(d);
    TU_CHECK_OK(t_call(&c, d, 10.0f, 1)); /* the baseline call is valid */

    call_args b = a;
    b.R = 0;
    t_expect_fail(1, &b, d, DG_ERR_VALUE, "num_ranks", "zero ranks");
    b = a, b.E = 7;
    t_expect_fail(1, &b, d, DG_ERR_VALUE, "num_experts", "experts not divisible by ranks");
    b = a, b.E = 16;
    t_expect_fail(1, &b, d, DG_ERR_SHAPE, "l1_weights[0]", "experts per rank disagree with E/R");
    b = a, b.clamp = -1.0f;
    t_expect_fail(1, &b, d, DG_ERR_VALUE, "activation_clamp", "negative clamp");
    b = a, b.clamp = NAN;
    t_expect_fail(1, &b, d, DG_ERR_VALUE, "activation_clamp", "NaN clamp");
    b = a, b.no_x = 1;
    t_expect_fail(1, &b, d, DG_ERR_NULL_POINTER, "'x'", "x array NULL");
    b = a, b.x[1] = NULL;
    t_expect_fail(1, &b, d, DG_ERR_NULL_POINTER, "x[1]", "x[1] NULL");
    b = a, b.no_xs = 1;
    t_expect_fail(1, &b, d, DG_ERR_NULL_POINTER, "x_sf", "x_sf array NULL");
    b = a, b.no_l2s = 1;
    t_expect_fail(1, &b, d, DG_ERR_NULL_POINTER, "l2_weights_sf", "l2_weights_sf array NULL");
    b = a, b.st[1] = NULL;
    t_expect_fail(1, &b, d, DG_ERR_NULL_POINTER, "cumulative_local_expert_recv_stats[1]", "stats[1] NULL");

    dg_tensor xb = dg_tensor_2d(d[1].x.data, DG_BFLOAT16, 7, 64); /* same bytes, wrong dtype */
    b = a, b.x[1] = &xb;
    t_expect_fail(1, &b, d, DG_ERR_DTYPE, "x[1]", "x[1] BF16 in the FP8 variant");
    dg_tensor xh = dg_tensor_2d(d[1].x.data, DG_FLOAT8_E4M3, 7, 96);
    b = a, b.x[1] = &xh;
    t_expect_fail(1, &b, d, DG_ERR_SHAPE, "x[1]", "x[1] hidden mismatch");
    dg_tensor xs = dg_tensor_2d(d[0].x_sf.data, DG_INT32, 5, 2);
    b = a, b.xs[0] = &xs;
    t_expect_fail(1, &b, d, DG_ERR_SHAPE, "x_sf[0]", "x_sf[0] shape");
    dg_tensor xs8 = dg_tensor_2d(d[0].x_sf.data, DG_UE8M0, 5, 4);
    b = a, b.xs[0] = &xs8;
    t_expect_fail(1, &b, d, DG_ERR_DTYPE, "x_sf[0]", "x_sf[0] dtype");

    dg_tensor l1s = dg_tensor_3d(d[1].l1.data, DG_FP4_E2M1X2, 4, 126, 64);
    b = a, b.l1[1] = &l1s;
    t_expect_fail(1, &b, d, DG_ERR_SHAPE, "l1_weights[1]", "l1_weights[1] 2I mismatch");
    dg_tensor l2h = dg_tensor_3d(d[0].l2.data, DG_FP4_E2M1X2, 4, 96, 32);
    b = a, b.l2[0] = &l2h;
    t_expect_fail(1, &b, d, DG_ERR_SHAPE, "l2_weights[0]", "l2_weights[0] hidden mismatch");
    dg_tensor l1bf = dg_tensor_3d(d[0].l1.data, DG_BFLOAT16, 4, 128, 64);
    b = a, b.l1[0] = &l1bf;
    t_expect_fail(1, &b, d, DG_ERR_DTYPE, "l1_weights[0]", "BF16 weights in the FP8 variant");
    /* FP4 pairs along the N dimension (an MN-major view): logically [4, 128, 128] but not K-major. */
    dg_tensor l1mn = dg_tensor_transpose(dg_tensor_3d(d[1].l1.data, DG_FP4_E2M1X2, 4, 128, 64), 1, 2);
    b = a, b.l1[1] = &l1mn;
    t_expect_fail(1, &b, d, DG_ERR_LAYOUT, "l1_weights[1]", "MN-major FP4 weights");
    dg_tensor l1sf = d[1].l1_sf;
    l1sf.shape[2] = 2;
    b = a, b.l1s[1] = &l1sf;
    t_expect_fail(1, &b, d, DG_ERR_SHAPE, "l1_weights_sf[1]", "l1_weights_sf[1] shape");

    int64_t bad_idx[21];
    memcpy(bad_idx, d[1].idx.data, sizeof bad_idx);
    bad_idx[13] = 8;
    dg_tensor ib = dg_tensor_2d(bad_idx, DG_INT64, 7, 3);
    b = a, b.idx[1] = &ib;
    t_expect_fail(1, &b, d, DG_ERR_VALUE, "topk_idx[1]", "expert id == E");
    bad_idx[13] = -2;
    t_expect_fail(1, &b, d, DG_ERR_VALUE, "topk_idx[1]", "expert id -2");
    dg_tensor if32 = dg_tensor_2d(d[0].w.data, DG_FLOAT32, 5, 3);
    b = a, b.idx[0] = &if32;
    t_expect_fail(1, &b, d, DG_ERR_DTYPE, "topk_idx[0]", "float top-k ids");
    dg_tensor ik = dg_tensor_2d(d[1].idx.data, DG_INT64, 7, 2);
    b = a, b.idx[1] = &ik;
    t_expect_fail(1, &b, d, DG_ERR_SHAPE, "topk_idx[1]", "num_topk differs between ranks");
    dg_tensor wb = dg_tensor_2d(d[0].w.data, DG_BFLOAT16, 5, 3);
    b = a, b.w[0] = &wb;
    t_expect_fail(1, &b, d, DG_ERR_DTYPE, "topk_weights[0]", "BF16 top-k weights");
    dg_tensor wt = dg_tensor_2d(d[1].w.data, DG_FLOAT32, 6, 3);
    b = a, b.w[1] = &wt;
    t_expect_fail(1, &b, d, DG_ERR_SHAPE, "topk_weights[1]", "top-k weights token count");

    dg_tensor yf = dg_tensor_2d(d[0].y.data, DG_FLOAT32, 5, 64);
    b = a, b.y[0] = &yf;
    t_expect_fail(1, &b, d, DG_ERR_DTYPE, "y[0]", "FLOAT32 y");
    dg_tensor yt = dg_tensor_2d(d[1].y.data, DG_BFLOAT16, 6, 128);
    b = a, b.y[1] = &yt;
    t_expect_fail(1, &b, d, DG_ERR_SHAPE, "y[1]", "y token count");
    dg_tensor yo = dg_tensor_2d(d[0].l1.data, DG_BFLOAT16, 7, 128); /* inside rank 0's L1 weights */
    b = a, b.y[1] = &yo;
    t_expect_fail(1, &b, d, DG_ERR_LAYOUT, "l1_weights[0]", "y[1] overlapping an input of another rank");
    dg_tensor so = dg_tensor_1d(d[0].y.data, DG_INT32, 4); /* stats inside y[0] */
    b = a, b.st[1] = &so;
    t_expect_fail(1, &b, d, DG_ERR_LAYOUT, "y[0]", "stats overlapping an output");
    dg_tensor s64 = dg_tensor_1d(d[0].stats.data, DG_INT64, 2);
    b = a, b.st[0] = &s64;
    t_expect_fail(1, &b, d, DG_ERR_DTYPE, "cumulative_local_expert_recv_stats[0]", "INT64 stats");
    dg_tensor s3 = dg_tensor_1d(d[1].stats.data, DG_INT32, 3);
    b = a, b.st[1] = &s3;
    t_expect_fail(1, &b, d, DG_ERR_SHAPE, "cumulative_local_expert_recv_stats[1]", "stats size");
    for (int r = 0; r < 2; ++r)
        t_free_rank(&d[r]);
}

static void test_bad_bf16(void) {
    cfg c = {.R = 2, .E = 8, .K = 3, .H = 64, .I = 32, .T = {4, 3}, .fp8 = 0, .idx64 = 0, .empty_expert = -1,
             .seed = 22};
    tu_rng rng = {c.seed};
    rank_data d[2];
    for (int r = 0; r < 2; ++r)
        t_make_rank(&rng, &c, r, &d[r]);
    call_args a = t_args(d);
    TU_CHECK_OK(t_call(&c, d, INFINITY, 1));
    call_args b = a;
    dg_tensor x8 = dg_tensor_2d(d[0].x.data, DG_FLOAT8_E4M3, 4, 64);
    b.x[0] = &x8;
    t_expect_fail(0, &b, d, DG_ERR_DTYPE, "x[0]", "FP8 x in the BF16 variant");
    dg_tensor l2f = dg_tensor_3d(d[1].l2.data, DG_FP4_E2M1X2, 4, 64, 16);
    b = a, b.l2[1] = &l2f;
    t_expect_fail(0, &b, d, DG_ERR_DTYPE, "l2_weights[1]", "FP4 weights in the BF16 variant");
    dg_tensor l1o = dg_tensor_3d(d[1].l1.data, DG_BFLOAT16, 4, 63, 64);
    b = a, b.l1[0] = &l1o;
    t_expect_fail(0, &b, d, DG_ERR_SHAPE, "l1_weights[0]", "odd 2I");
    int32_t bad[9];
    memcpy(bad, d[1].idx.data, sizeof bad);
    bad[4] = 99;
    dg_tensor ib = dg_tensor_2d(bad, DG_INT32, 3, 3);
    b = a, b.idx[1] = &ib;
    t_expect_fail(0, &b, d, DG_ERR_VALUE, "topk_idx[1]", "expert id 99");
    b = a, b.y[1] = b.y[0];
    t_expect_fail(0, &b, d, DG_ERR_SHAPE, "y[1]", "y[0] passed for rank 1 (token counts differ)");
    for (int r = 0; r < 2; ++r)
        t_free_rank(&d[r]);
}

int main(void) {
    test_combine_row();
    test_dispatch_order();
    test_chains();
    test_bad_fp8();
    test_bad_bf16();
    return tu_finish();
}
