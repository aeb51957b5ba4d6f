/*
 * test_paged_mqa_logits.c - dg_get_paged_mqa_logits_metadata and dg_fp8(_fp4)_paged_mqa_logits
 * against a naive formula written here: the fused cache is built and dequantized by the test's
 * own byte indexing, blocks are gathered through shuffled block tables, and the visibility
 * rules (1-D and 2-D context lengths, varlen indices) are applied per position.
 */
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct paged_case {
    int64_t b, n, h, d, bk, nblocks, max_blocks, max_ctx, pad;
    int fp4, mx, bf16, lens_2d; /* fp4: MXFP4; mx: per-32 UE8M0 words (MXFP4, MXFP8) */
    int32_t *ctx;        /* [B] or [B, N] */
    float *qd, *w, *kvd; /* dequantized q [B*N*H*D], weights [B*N*H], cache [nblocks*bk*D] */
    float *qo, *kvo;     /* unquantized */
    dg_tensor tq, tqsf, tcache, tw, tctx, tbt, tidx, tmeta;
    int has_idx;
} paged_case;

/* d E4M3 codes of x with per-32 UE8M0 scales (MXFP8, DeepGEMM's per_token_cast_to_fp8 with
 * use_ue8m0, gran_k = 32): the packed word of scales; deq gets the dequantized values. */
static uint32_t mxfp8_row(const float *x, int64_t d, uint8_t *out, float *deq) {
    uint32_t word = 0x7f7f7f7fu;
    for (int64_t g = 0; g < d / 32; ++g) {
        float amax = 1e-4f;
        for (int64_t k = g * 32; k < g * 32 + 32; ++k)
            amax = fmaxf(amax, fabsf(x[k]));
        const float sf = dg_ceil_to_ue8m0(amax / 448.0f);
        word = (word & ~(0xffu << (8 * g))) | ((uint32_t)dg_float_to_ue8m0(amax / 448.0f) << (8 * g));
        for (int64_t k = g * 32; k < g * 32 + 32; ++k) {
            out[k] = dg_float_to_e4m3(x[k] * (1.0f / sf));
            deq[k] = dg_e4m3_to_float(out[k]) * sf;
        }
    }
    return word;
}

/* One token's row: FP8 with a float per-token scale (amax / 448, as DeepGEMM's test), MXFP8,
 * or FP4 with per-32 UE8M0 scales packed into an int32. Writes values and scale into the block. */
static void put_token(paged_case *c, int64_t blk, int64_t tok, const float *x) {
    uint8_t *base = (uint8_t *)c->tcache.data + blk * c->tcache.strides[0];
    float *deq = c->kvd + (blk * c->bk + tok) * c->d;
    if (c->mx && !c->fp4) {
        const uint32_t word = mxfp8_row(x, c->d, base + tok * c->d, deq);
        memcpy(base + c->bk * c->d + tok * 4, &word, 4);
        return;
    }
    if (!c->fp4) {
        float amax = 1e-4f;
        for (int64_t k = 0; k < c->d; ++k)
            amax = fmaxf(amax, fabsf(x[k]));
        const float sf = amax / 448.0f;
        for (int64_t k = 0; k < c->d; ++k) {
            base[tok * c->d + k] = dg_float_to_e4m3(x[k] * (1.0f / sf));
            deq[k] = dg_e4m3_to_float(base[tok * c->d + k]) * sf;
        }
        memcpy(base + c->bk * c->d + tok * 4, &sf, 4);
        return;
    }
    uint32_t word = 0x7f7f7f7fu;
    for (int64_t g = 0; g < c->d / 32; ++g) {
        float amax = 1e-4f;
        for (int64_t k = g * 32; k < g * 32 + 32; ++k)
            amax = fmaxf(amax, fabsf(x[k]));
        const float sf = dg_ceil_to_ue8m0(amax / 6.0f);
        word = (word & ~(0xffu << (8 * g))) | ((uint32_t)dg_float_to_ue8m0(amax / 6.0f) << (8 * g));
        for (int64_t k = g * 32; k < g * 32 + 32; ++k) {
            const uint8_t code = dg_float_to_e2m1(x[k] * (1.0f / sf));
            uint8_t *byte = base + tok * (c->d / 2) + k / 2;
            *byte = (k & 1) ? (uint8_t)((*byte & 15) | (code << 4)) : (uint8_t)((*byte & 0xf0) | code);
            deq[k] = dg_e2m1_to_float(code) * sf;
        }
    }
    memcpy(base + c->bk * (c->d / 2) + tok * 4, &word, 4);
}

static void put_query(paged_case *c, int64_t row, const float *x) {
    if (c->mx && !c->fp4) {
        ((int32_t *)c->tqsf.data)[row] =
            (int32_t)mxfp8_row(x, c->d, (uint8_t *)c->tq.data + row * c->d, c->qd + row * c->d);
        return;
    }
    if (!c->fp4) {
        for (int64_t k = 0; k < c->d; ++k) {
            ((uint8_t *)c->tq.data)[row * c->d + k] = dg_float_to_e4m3(x[k]);
            c->qd[row * c->d + k] = dg_e4m3_to_float(((uint8_t *)c->tq.data)[row * c->d + k]);
        }
        return;
    }
    uint32_t word = 0x7f7f7f7fu;
    for (int64_t g = 0; g < c->d / 32; ++g) {
        float amax = 1e-4f;
        for (int64_t k = g * 32; k < g * 32 + 32; ++k)
            amax = fmaxf(amax, fabsf(x[k]));
        const float sf = dg_ceil_to_ue8m0(amax / 6.0f);
        word = (word & ~(0xffu << (8 * g))) | ((uint32_t)dg_float_to_ue8m0(amax / 6.0f) << (8 * g));
        for (int64_t k = g * 32; k < g * 32 + 32; ++k) {
            const uint8_t code = dg_float_to_e2m1(x[k] * (1.0f / sf));
            uint8_t *byte = (uint8_t *)c->tq.data + (row * c->d + k) / 2;
            *byte = (k & 1) ? (uint8_t)((*byte & 15) | (code << 4)) : (uint8_t)((*byte & 0xf0) | code);
            c->qd[row * c->d + k] = dg_e2m1_to_float(code) * sf;
        }
    }
    ((int32_t *)c->tqsf.data)[row] = (int32_t)word;
}

/* Number of leading positions row r sees, by the SPEC's rules. */
static int64_t visible(const paged_case *c, int64_t r) {
    const int64_t b = r / c->n, t = r % c->n;
    if (c->lens_2d)
        return c->ctx[r];
    const int64_t lim = c->ctx[b] - c->n + t + 1;
    return lim < 0 ? 0 : (lim < c->ctx[b] ? lim : c->ctx[b]);
}

/* runs: varlen tokens per sequence (NULL: regular batch). ctx_lo/hi: context range. */
/* fmt: 0 FP8 (float kv scales), 1 MXFP4, 2 MXFP8. */
static void make_case(paged_case *c, tu_rng *rng, int64_t b, int64_t n, int64_t h, int64_t d, int64_t bk, int fmt,
                      int bf16, int lens_2d, const int *runs, int nruns, int64_t pad) {
    memset(c, 0, sizeof *c);
    const int fp4 = fmt == 1;
    c->n = n, c->h = h, c->d = d, c->bk = bk, c->fp4 = fp4, c->mx = fmt != 0, c->bf16 = bf16, c->lens_2d = lens_2d;
    c->pad = pad;
    c->b = b;
    if (runs) { /* varlen: b rows, one token each */
        c->b = 0;
        for (int i = 0; i < nruns; ++i)
            c->b += runs[i];
        c->n = n = 1, c->lens_2d = lens_2d = 1, c->has_idx = 1;
    }
    b = c->b;
    /* Context lengths: per sequence, then per token. */
    c->ctx = calloc((size_t)(b * n), sizeof(int32_t));
    int32_t *seq_ctx = calloc((size_t)b, sizeof(int32_t));
    c->tidx = tu_alloc(DG_INT32, 1, (int64_t[]){b});
    int64_t nseq = runs ? nruns : b, row = 0, max_need = 0;
    for (int64_t s = 0; s < nseq; ++s) {
        const int64_t ntok = runs ? runs[s] : 1;
        const int64_t base = tu_randint(rng, 0, 3 * bk + 5);
        for (int64_t t = 0; t < ntok; ++t, ++row) {
            seq_ctx[row] = (int32_t)(base + t); /* varlen: later tokens see one more */
            ((int32_t *)c->tidx.data)[row] = (int32_t)(s * 3 + 1);
            max_need = base + t > max_need ? base + t : max_need;
        }
    }
    if (!runs)
        for (int64_t s = 0; s < b; ++s) {
            if (lens_2d) { /* random per token, the last token the longest */
                for (int64_t t = 0; t < n; ++t)
                    c->ctx[s * n + t] = (int32_t)tu_randint(rng, 0, seq_ctx[s]);
                c->ctx[s * n + n - 1] = seq_ctx[s];
            } else {
                c->ctx[s] = seq_ctx[s];
            }
        }
    else
        memcpy(c->ctx, seq_ctx, (size_t)b * sizeof(int32_t));
    c->max_blocks = (max_need + bk - 1) / bk + 1;
    c->max_ctx = max_need + 3; /* wider than every context, not block aligned */
    /* Cache blocks: every sequence gets its own, shuffled; a few extra unused ones. */
    int64_t total = 0;
    for (int64_t s = 0; s < b; ++s)
        total += (seq_ctx[s] + bk - 1) / bk;
    c->nblocks = total + 3;
    const int64_t row_bytes = (fp4 ? d / 2 : d) + 4;
    const int64_t cache_shape[4] = {c->nblocks, bk, 1, row_bytes};
    c->tcache = dg_tensor_make(NULL, DG_UINT8, 4, cache_shape);
    c->tcache.strides[0] = bk * row_bytes + pad;
    c->tcache.data = calloc((size_t)(c->nblocks * c->tcache.strides[0]), 1);
    c->kvd = calloc((size_t)(c->nblocks * bk * d), sizeof(float));
    c->kvo = calloc((size_t)(c->nblocks * bk * d), sizeof(float));
    tu_fill_normal(rng, c->kvo, (size_t)(c->nblocks * bk * d), 1.0f);
    for (int64_t blk = 0; blk < c->nblocks; ++blk)
        for (int64_t tok = 0; tok < bk; ++tok)
            put_token(c, blk, tok, c->kvo + (blk * bk + tok) * d);
    int64_t *perm = malloc(sizeof(int64_t) * (size_t)c->nblocks);
    for (int64_t i = 0; i < c->nblocks; ++i)
        perm[i] = i;
    for (int64_t i = c->nblocks - 1; i > 0; --i) {
        const int64_t j = tu_randint(rng, 0, i), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    c->tbt = tu_alloc2(DG_INT32, b, c->max_blocks);
    int32_t *bt = c->tbt.data;
    int64_t next = 0;
    row = 0;
    for (int64_t s = 0; s < nseq; ++s) {
        const int64_t ntok = runs ? runs[s] : 1, first = row;
        const int64_t need = (seq_ctx[first + ntok - 1] + bk - 1) / bk;
        for (int64_t k = 0; k < c->max_blocks; ++k)
            bt[first * c->max_blocks + k] = k < need ? (int32_t)perm[next++] : -1; /* -1: never read */
        for (int64_t t = 1; t < ntok; ++t)
            memcpy(bt + (first + t) * c->max_blocks, bt + first * c->max_blocks, (size_t)c->max_blocks * 4);
        row += ntok;
    }
    free(perm), free(seq_ctx);
    /* Queries and weights. */
    c->tq = tu_alloc(fp4 ? DG_FP4_E2M1X2 : DG_FLOAT8_E4M3, 4, (int64_t[]){b, n, h, fp4 ? d / 2 : d});
    if (c->mx)
        c->tqsf = tu_alloc3(DG_INT32, b, n, h);
    c->qd = calloc((size_t)(b * n * h * d), sizeof(float));
    c->qo = calloc((size_t)(b * n * h * d), sizeof(float));
    tu_fill_normal(rng, c->qo, (size_t)(b * n * h * d), 1.0f);
    for (int64_t r = 0; r < b * n * h; ++r)
        put_query(c, r, c->qo + r * d);
    c->w = calloc((size_t)(b * n * h), sizeof(float));
    tu_fill_normal(rng, c->w, (size_t)(b * n * h), 1.0f);
    c->tw = tu_alloc2(bf16 ? DG_BFLOAT16 : DG_FLOAT32, b * n, h);
    for (int64_t i = 0; i < b * n * h; ++i) {
        if (bf16) {
            ((uint16_t *)c->tw.data)[i] = dg_float_to_bf16(c->w[i]);
            c->w[i] = dg_bf16_to_float(((uint16_t *)c->tw.data)[i]);
        } else {
            ((float *)c->tw.data)[i] = c->w[i];
        }
    }
    c->tctx = lens_2d ? dg_tensor_2d(c->ctx, DG_INT32, b, n) : dg_tensor_1d(c->ctx, DG_INT32, b);
    c->tmeta = tu_alloc2(DG_INT32, dg_get_num_sms() + 1, 2);
}

static void free_case(paged_case *c) {
    free(c->ctx), free(c->qd), free(c->w), free(c->kvd), free(c->qo), free(c->kvo);
    tu_free(&c->tq), tu_free(&c->tqsf), tu_free(&c->tcache), tu_free(&c->tw), tu_free(&c->tbt), tu_free(&c->tidx);
    tu_free(&c->tmeta);
}

/* The SPEC's formula: q and kv dequantized (kv including its scale), gathered through the table. */
static double naive(const paged_case *c, const float *q, const float *kv, int64_t r, int64_t p, double *mag) {
    const int64_t blk = ((int32_t *)c->tbt.data)[(r / c->n) * c->max_blocks + p / c->bk];
    const float *k = kv + (blk * c->bk + p % c->bk) * c->d;
    double sum = 0, m = 0;
    for (int64_t h = 0; h < c->h; ++h) {
        double dot = 0, a = 0;
        for (int64_t i = 0; i < c->d; ++i) {
            dot += (double)q[(r * c->h + h) * c->d + i] * k[i];
            a += fabs((double)q[(r * c->h + h) * c->d + i] * k[i]);
        }
        sum += (dot > 0 ? dot : 0) * c->w[r * c->h + h];
        m += a * fabs(c->w[r * c->h + h]);
    }
    if (mag)
        *mag = m;
    return sum;
}

static dg_status run(paged_case *c, int clean, dg_tensor *out) {
    return dg_fp8_fp4_paged_mqa_logits(&c->tq, c->mx ? &c->tqsf : NULL, &c->tcache, &c->tw, &c->tctx, &c->tbt,
                                       &c->tmeta, (int)c->max_ctx, clean, c->has_idx ? &c->tidx : NULL, out);
}

static float get(const dg_tensor *t, int64_t i, int64_t j) {
    const int64_t off = i * t->strides[0] + j;
    return t->dtype == DG_FLOAT32 ? ((float *)t->data)[off] : dg_bf16_to_float(((uint16_t *)t->data)[off]);
}

/* Values, masks, no-clean sentinels, determinism and one accuracy check per case. */
static void check_case(paged_case *c, const char *tag, int accuracy) {
    TU_CHECK_OK(dg_get_paged_mqa_logits_metadata(&c->tctx, (int)c->bk, dg_get_num_sms(),
                                                 c->has_idx ? &c->tidx : NULL, &c->tmeta));
    dg_tensor out = {0};
    out.dtype = c->bf16 ? DG_BFLOAT16 : DG_FLOAT32;
    TU_CHECK_OK(run(c, 1, &out));
    TU_CHECK(out.shape[0] == c->b * c->n && out.shape[1] == c->max_ctx, "%s: query shape", tag);
    const int64_t align_elems = c->bf16 ? 512 : 256, padded = (c->max_ctx + 255) / 256 * 256;
    TU_CHECK(out.strides[0] == (padded + align_elems - 1) / align_elems * align_elems && out.strides[1] == 1,
             "%s: DeepGEMM's padded row stride (%lld)", tag, (long long)out.strides[0]);
    const size_t bytes = dg_tensor_nbytes(&out), es = dg_dtype_size(out.dtype);
    out.data = malloc(bytes + 1);
    memset(out.data, 0x5a, bytes); /* the row padding must compare equal below */
    TU_CHECK_OK(run(c, 1, &out));
    const double rel = c->bf16 ? 1.0 / 128 : 3e-7;
    int bad = 0, mask_bad = 0;
    const int64_t rows = c->b * c->n;
    float *got = calloc((size_t)(rows * c->max_ctx), 4), *ref = calloc((size_t)(rows * c->max_ctx), 4);
    float *sim = calloc((size_t)(rows * c->max_ctx), 4);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t p = 0; p < c->max_ctx; ++p) {
            const float v = get(&out, r, p);
            if (p >= visible(c, r)) {
                mask_bad += !(isinf(v) && v < 0);
                continue;
            }
            double mag;
            const double want = naive(c, c->qd, c->kvd, r, p, &mag);
            bad += !(fabs(v - want) <= rel * fabs(want) + 2e-7 * mag);
            got[r * c->max_ctx + p] = v;
            sim[r * c->max_ctx + p] = (float)want;
            ref[r * c->max_ctx + p] = (float)naive(c, c->qo, c->kvo, r, p, NULL);
        }
    TU_CHECK(bad == 0, "%s: %d entries differ from the naive formula", tag, bad);
    TU_CHECK(mask_bad == 0, "%s: %d invisible entries are not -inf", tag, mask_bad);
    if (accuracy) {
        const size_t n = (size_t)(rows * c->max_ctx);
        const double diff = tu_calc_diff(got, ref, n), sdiff = tu_calc_diff(got, sim, n);
        TU_CHECK(diff < (c->mx ? 0.02 : 1e-3) && diff > 0, "%s: calc_diff vs unquantized %g", tag, diff);
        TU_CHECK(sdiff < (c->bf16 ? 3e-5 : 5e-6), "%s: calc_diff vs dequantized %g", tag, sdiff);
    }
    free(got), free(ref), free(sim);
    /* Repeat: bitwise equal. No clean: invisible entries keep their bytes. */
    dg_tensor again = out;
    again.data = malloc(bytes + 1);
    memset(again.data, 0x5a, bytes);
    TU_CHECK_OK(run(c, 1, &again));
    TU_CHECK(memcmp(again.data, out.data, bytes) == 0, "%s: repeat is bitwise equal", tag);
    memset(again.data, 0x5a, bytes);
    TU_CHECK_OK(run(c, 0, &again));
    int kept = 0, same = 0;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t p = 0; p < c->max_ctx; ++p) {
            const char *a = (char *)again.data + (r * out.strides[0] + p) * (int64_t)es;
            if (p >= visible(c, r))
                kept += a[0] != 0x5a;
            else
                same += memcmp(a, (char *)out.data + (r * out.strides[0] + p) * (int64_t)es, es) != 0;
        }
    TU_CHECK(kept == 0 && same == 0, "%s: no-clean run (%d overwritten, %d differ)", tag, kept, same);
    /* The legacy FP8 entry gives the same bits. */
    if (!c->mx && !c->bf16) {
        memset(again.data, 0x5a, bytes);
        TU_CHECK_OK(dg_fp8_paged_mqa_logits(&c->tq, &c->tcache, &c->tw, &c->tctx, &c->tbt, &c->tmeta,
                                            (int)c->max_ctx, 1, c->has_idx ? &c->tidx : NULL, &again));
        TU_CHECK(memcmp(again.data, out.data, bytes) == 0, "%s: legacy entry equal", tag);
    }
    free(again.data), free(out.data);
}

/* Metadata: per-part work from consecutive rows sums to the total and is balanced. */
static void check_metadata(paged_case *c, int num_sms, const char *tag) {
    dg_tensor meta = {0};
    TU_CHECK_OK(dg_get_paged_mqa_logits_metadata(&c->tctx, (int)c->bk, num_sms, c->has_idx ? &c->tidx : NULL,
                                                 &meta));
    TU_CHECK(meta.dtype == DG_INT32 && meta.ndim == 2 && meta.shape[0] == num_sms + 1 && meta.shape[1] == 2,
             "%s: metadata query shape", tag);
    meta.data = malloc(dg_tensor_nbytes(&meta));
    TU_CHECK_OK(dg_get_paged_mqa_logits_metadata(&c->tctx, (int)c->bk, num_sms, c->has_idx ? &c->tidx : NULL,
                                                 &meta));
    const int32_t *m = meta.data, *idx = c->has_idx ? c->tidx.data : NULL;
    /* Independent request table: coordinate -> (work before it, tokens). */
    const int64_t rows = c->lens_2d ? c->b * c->n : c->b;
    int64_t *before = calloc((size_t)rows + 1, sizeof(int64_t)), *ntok = calloc((size_t)rows + 1, sizeof(int64_t));
    int64_t total = 0, max_tok = 1;
    for (int64_t r = 0; r < rows;) {
        int64_t len = c->lens_2d && !idx ? c->n : 1;
        while (idx && r + len < rows && idx[r + len] == idx[r])
            ++len;
        const int64_t ctx = c->ctx[r + len - 1];
        before[r] = total, ntok[r] = len;
        total += (ctx + 255) / 256 * len;
        max_tok = len > max_tok ? len : max_tok;
        r += len;
    }
    before[rows] = total;
    int ok = m[num_sms * 2] == rows && m[num_sms * 2 + 1] == 0;
    int64_t sum = 0, lo = total, hi = 0;
    for (int i = 0; i <= num_sms; ++i)
        ok &= m[i * 2] >= 0 && m[i * 2] <= rows && (m[i * 2] == rows ? m[i * 2 + 1] == 0 : ntok[m[i * 2]] > 0);
    for (int i = 0; ok && i < num_sms; ++i) {
        const int64_t u0 = before[m[i * 2]] + m[i * 2 + 1] * (ntok[m[i * 2]] ? ntok[m[i * 2]] : 1);
        const int64_t u1 = before[m[i * 2 + 2]] + m[i * 2 + 3] * (ntok[m[i * 2 + 2]] ? ntok[m[i * 2 + 2]] : 1);
        ok &= u1 >= u0;
        sum += u1 - u0;
        lo = u1 - u0 < lo ? u1 - u0 : lo;
        hi = u1 - u0 > hi ? u1 - u0 : hi;
    }
    TU_CHECK(ok && sum == total, "%s num_sms=%d: rows cover the work (%lld of %lld)", tag, num_sms, (long long)sum,
             (long long)total);
    TU_CHECK(hi <= total / num_sms + 1 + max_tok && lo + max_tok + 1 >= total / num_sms,
             "%s num_sms=%d: balanced (%lld..%lld, mean %lld)", tag, num_sms, (long long)lo, (long long)hi,
             (long long)(total / num_sms));
    free(before), free(ntok), free(meta.data);
}

#define EXPECT_BAD(call, want, arg)                                                                  \
    do {                                                                                             \
        memset(out.data, 0x33, bytes);                                                               \
        TU_CHECK_STATUS(call, want);                                                                 \
        TU_CHECK(strstr(dg_last_error(), arg) != NULL, "message names %s: %s", arg, dg_last_error()); \
        TU_CHECK(tu_unchanged(&out, snap), "output untouched after a bad %s", arg);                   \
    } while (0)

/* Calls the FP8/FP4 entry with c's tensors, replacing one through the pointers given. */
#define CALL(cq, cqsf, ccache, cw, cctx, cbt, cmeta, maxc, cidx)                                   \
    dg_fp8_fp4_paged_mqa_logits(cq, cqsf, ccache, cw, cctx, cbt, cmeta, maxc, 1, cidx, &out)

static void test_bad_inputs(void) {
    tu_rng rng = {5};
    paged_case c, v;
    make_case(&c, &rng, 3, 2, 2, 32, 16, 0, 0, 0, NULL, 0, 0);
    const int runs[3] = {2, 1, 3};
    make_case(&v, &rng, 0, 1, 2, 64, 16, 1, 0, 1, runs, 3, 0);
    TU_CHECK_OK(dg_get_paged_mqa_logits_metadata(&c.tctx, 16, dg_get_num_sms(), NULL, &c.tmeta));
    TU_CHECK_OK(dg_get_paged_mqa_logits_metadata(&v.tctx, 16, dg_get_num_sms(), &v.tidx, &v.tmeta));
    dg_tensor out = tu_alloc2(DG_FLOAT32, c.b * c.n, c.max_ctx);
    const size_t bytes = dg_tensor_nbytes(&out);
    memset(out.data, 0x33, bytes);
    void *snap = tu_snapshot(&out);
    const int mc = (int)c.max_ctx;
    int32_t *bt = c.tbt.data, *ctx = c.ctx;
    dg_tensor t;

    EXPECT_BAD(CALL(NULL, NULL, &c.tcache, &c.tw, &c.tctx, &c.tbt, &c.tmeta, mc, NULL), DG_ERR_NULL_POINTER, "'q'");
    t = c.tq, t.dtype = DG_BFLOAT16;
    EXPECT_BAD(CALL(&t, NULL, &c.tcache, &c.tw, &c.tctx, &c.tbt, &c.tmeta, mc, NULL), DG_ERR_DTYPE, "'q'");
    t = c.tcache, t.dtype = DG_INT8;
    EXPECT_BAD(CALL(&c.tq, NULL, &t, &c.tw, &c.tctx, &c.tbt, &c.tmeta, mc, NULL), DG_ERR_DTYPE, "'kv_cache'");
    t = c.tcache, t.shape[3] = 33;
    EXPECT_BAD(CALL(&c.tq, NULL, &t, &c.tw, &c.tctx, &c.tbt, &c.tmeta, mc, NULL), DG_ERR_SHAPE, "'kv_cache'");
    t = c.tcache, t.strides[0] -= 2;
    EXPECT_BAD(CALL(&c.tq, NULL, &t, &c.tw, &c.tctx, &c.tbt, &c.tmeta, mc, NULL), DG_ERR_LAYOUT, "'kv_cache'");
    t = c.tcache, t.shape[2] = 2;
    EXPECT_BAD(CALL(&c.tq, NULL, &t, &c.tw, &c.tctx, &c.tbt, &c.tmeta, mc, NULL), DG_ERR_SHAPE, "'kv_cache'");
    t = c.tw, t.shape[0] = 5;
    EXPECT_BAD(CALL(&c.tq, NULL, &c.tcache, &t, &c.tctx, &c.tbt, &c.tmeta, mc, NULL), DG_ERR_SHAPE, "'weights'");
    dg_tensor wb = tu_alloc2(DG_BFLOAT16, c.b * c.n, c.h);
    EXPECT_BAD(CALL(&c.tq, NULL, &c.tcache, &wb, &c.tctx, &c.tbt, &c.tmeta, mc, NULL), DG_ERR_DTYPE, "'weights'");
    t = c.tctx, t.dtype = DG_INT64;
    EXPECT_BAD(CALL(&c.tq, NULL, &c.tcache, &c.tw, &t, &c.tbt, &c.tmeta, mc, NULL), DG_ERR_DTYPE, "'context_lens'");
    t = dg_tensor_2d(c.ctx, DG_INT32, c.b, 3);
    EXPECT_BAD(CALL(&c.tq, NULL, &c.tcache, &c.tw, &t, &c.tbt, &c.tmeta, mc, NULL), DG_ERR_SHAPE, "'context_lens'");
    t = c.tbt, t.dtype = DG_INT64;
    EXPECT_BAD(CALL(&c.tq, NULL, &c.tcache, &c.tw, &c.tctx, &t, &c.tmeta, mc, NULL), DG_ERR_DTYPE, "'block_table'");
    /* MXFP8: c's E4M3 q with a q_sf reads the cache's 4-byte scales as packed UE8M0 words. */
    dg_tensor qsf = tu_alloc3(DG_INT32, c.b, c.n, c.h);
    t = qsf, t.shape[2] = 1;
    EXPECT_BAD(CALL(&c.tq, &t, &c.tcache, &c.tw, &c.tctx, &c.tbt, &c.tmeta, mc, NULL), DG_ERR_SHAPE, "'q_sf'");
    t = qsf, t.dtype = DG_FLOAT32;
    EXPECT_BAD(CALL(&c.tq, &t, &c.tcache, &c.tw, &c.tctx, &c.tbt, &c.tmeta, mc, NULL), DG_ERR_DTYPE, "'q_sf'");
    dg_tensor q48 = tu_alloc(DG_FLOAT8_E4M3, 4, (int64_t[]){c.b, c.n, c.h, 48});
    EXPECT_BAD(CALL(&q48, &qsf, &c.tcache, &c.tw, &c.tctx, &c.tbt, &c.tmeta, mc, NULL), DG_ERR_SHAPE, "'q'");
    tu_free(&q48), tu_free(&qsf);
    /* Contents. */
    const int32_t saved_bt = bt[0], saved_ctx = ctx[0];
    ctx[0] = ctx[0] < 1 ? 1 : ctx[0]; /* make sure block 0 is read */
    TU_CHECK_OK(dg_get_paged_mqa_logits_metadata(&c.tctx, 16, dg_get_num_sms(), NULL, &c.tmeta));
    bt[0] = (int32_t)c.nblocks;
    EXPECT_BAD(CALL(&c.tq, NULL, &c.tcache, &c.tw, &c.tctx, &c.tbt, &c.tmeta, mc, NULL), DG_ERR_VALUE, "'block_table'");
    bt[0] = -1;
    EXPECT_BAD(CALL(&c.tq, NULL, &c.tcache, &c.tw, &c.tctx, &c.tbt, &c.tmeta, mc, NULL), DG_ERR_VALUE, "'block_table'");
    bt[0] = saved_bt;
    EXPECT_BAD(CALL(&c.tq, NULL, &c.tcache, &c.tw, &c.tctx, &c.tbt, &c.tmeta, (int)ctx[0] - 1 < 0 ? 0 : ctx[0] - 1, NULL),
               DG_ERR_VALUE, "'context_lens'");
    ctx[0] = (int32_t)c.max_ctx; /* within max_context_len, but needs more blocks than the table row */
    t = c.tbt, t.shape[1] = 1;
    TU_CHECK_OK(dg_get_paged_mqa_logits_metadata(&c.tctx, 16, dg_get_num_sms(), NULL, &c.tmeta));
    EXPECT_BAD(CALL(&c.tq, NULL, &c.tcache, &c.tw, &c.tctx, &t, &c.tmeta, mc, NULL), DG_ERR_VALUE, "'block_table'");
    ctx[0] = saved_ctx;
    TU_CHECK_OK(dg_get_paged_mqa_logits_metadata(&c.tctx, 16, dg_get_num_sms(), NULL, &c.tmeta));
    ((int32_t *)c.tmeta.data)[2 * dg_get_num_sms()] += 1; /* not what the metadata function gives */
    EXPECT_BAD(CALL(&c.tq, NULL, &c.tcache, &c.tw, &c.tctx, &c.tbt, &c.tmeta, mc, NULL), DG_ERR_VALUE,
               "'schedule_meta'");
    ((int32_t *)c.tmeta.data)[2 * dg_get_num_sms()] -= 1;
    t = c.tmeta, t.shape[0] -= 1;
    EXPECT_BAD(CALL(&c.tq, NULL, &c.tcache, &c.tw, &c.tctx, &c.tbt, &t, mc, NULL), DG_ERR_SHAPE, "'schedule_meta'");
    EXPECT_BAD(CALL(&c.tq, NULL, &c.tcache, &c.tw, &c.tctx, &c.tbt, &c.tmeta, -1, NULL), DG_ERR_VALUE,
               "'max_context_len'");
    dg_tensor idx2 = tu_alloc(DG_INT32, 1, (int64_t[]){c.b});
    EXPECT_BAD(CALL(&c.tq, NULL, &c.tcache, &c.tw, &c.tctx, &c.tbt, &c.tmeta, mc, &idx2), DG_ERR_SHAPE, "'indices'");
    tu_free(&idx2);
    /* Output. */
    EXPECT_BAD(dg_fp8_fp4_paged_mqa_logits(&c.tq, NULL, &c.tcache, &c.tw, &c.tctx, &c.tbt, &c.tmeta, mc, 1, NULL, NULL),
               DG_ERR_NULL_POINTER, "'logits'");
    t = dg_tensor_2d(out.data, DG_FLOAT32, c.b * c.n, mc - 1);
    EXPECT_BAD(dg_fp8_paged_mqa_logits(&c.tq, &c.tcache, &c.tw, &c.tctx, &c.tbt, &c.tmeta, mc, 1, NULL, &t),
               DG_ERR_SHAPE, "'logits'");
    t = dg_tensor_2d(out.data, DG_BFLOAT16, c.b * c.n, mc);
    EXPECT_BAD(dg_fp8_paged_mqa_logits(&c.tq, &c.tcache, &c.tw, &c.tctx, &c.tbt, &c.tmeta, mc, 1, NULL, &t),
               DG_ERR_DTYPE, "'logits'");
    /* 2-D lengths: a token longer than the sequence's last token. */
    dg_tensor ctx2 = tu_alloc2(DG_INT32, c.b, c.n);
    for (int64_t i = 0; i < c.b * c.n; ++i)
        ((int32_t *)ctx2.data)[i] = (i % c.n == 0) ? 5 : 3;
    dg_tensor meta2 = tu_alloc2(DG_INT32, dg_get_num_sms() + 1, 2);
    TU_CHECK_OK(dg_get_paged_mqa_logits_metadata(&ctx2, 16, dg_get_num_sms(), NULL, &meta2));
    EXPECT_BAD(CALL(&c.tq, NULL, &c.tcache, &c.tw, &ctx2, &c.tbt, &meta2, mc, NULL), DG_ERR_VALUE, "'context_lens'");
    tu_free(&ctx2), tu_free(&meta2);
    /* Varlen: rows of one run that read different blocks; a longer-than-last token. */
    dg_tensor vout = tu_alloc2(DG_FLOAT32, v.b, v.max_ctx);
    memset(vout.data, 0x33, dg_tensor_nbytes(&vout));
    void *vsnap = tu_snapshot(&vout);
    int32_t *vbt = v.tbt.data;
    const int32_t save = vbt[v.max_blocks];
    vbt[v.max_blocks] = vbt[v.max_blocks] == 0 ? 1 : 0; /* row 1 (same run as row 0), block 0 */
    TU_CHECK_STATUS(dg_fp8_fp4_paged_mqa_logits(&v.tq, &v.tqsf, &v.tcache, &v.tw, &v.tctx, &v.tbt, &v.tmeta,
                                                (int)v.max_ctx, 0, &v.tidx, &vout),
                    v.ctx[1] > 0 ? DG_ERR_VALUE : DG_OK);
    vbt[v.max_blocks] = save;
    TU_CHECK(tu_unchanged(&vout, vsnap), "varlen output untouched");
    v.ctx[0] = v.ctx[1] + 1; /* the run's first token sees more than its last */
    TU_CHECK_STATUS(dg_fp8_fp4_paged_mqa_logits(&v.tq, &v.tqsf, &v.tcache, &v.tw, &v.tctx, &v.tbt, &v.tmeta,
                                                (int)v.max_ctx, 0, &v.tidx, &vout), DG_ERR_VALUE);
    TU_CHECK(strstr(dg_last_error(), "'context_lens'") && tu_unchanged(&vout, vsnap), "%s", dg_last_error());
    free(vsnap), tu_free(&vout);
    /* Metadata arguments. */
    dg_tensor meta = {0};
    TU_CHECK_STATUS(dg_get_paged_mqa_logits_metadata(&c.tctx, 0, 4, NULL, &meta), DG_ERR_VALUE);
    TU_CHECK_STATUS(dg_get_paged_mqa_logits_metadata(&c.tctx, 16, 0, NULL, &meta), DG_ERR_VALUE);
    TU_CHECK_STATUS(dg_get_paged_mqa_logits_metadata(NULL, 16, 4, NULL, &meta), DG_ERR_NULL_POINTER);
    TU_CHECK_STATUS(dg_get_paged_mqa_logits_metadata(&c.tctx, 16, 4, NULL, NULL), DG_ERR_NULL_POINTER);
    dg_tensor m5 = tu_alloc2(DG_INT32, 5, 2), m4 = tu_alloc2(DG_INT32, 4, 2);
    memset(m5.data, 0x44, 40);
    void *msnap = tu_snapshot(&m5);
    TU_CHECK_STATUS(dg_get_paged_mqa_logits_metadata(&c.tctx, 16, 3, NULL, &m5), DG_ERR_SHAPE);
    ctx[1] = -3;
    TU_CHECK_STATUS(dg_get_paged_mqa_logits_metadata(&c.tctx, 16, 4, NULL, &m5), DG_ERR_VALUE);
    TU_CHECK(strstr(dg_last_error(), "'context_lens'") && tu_unchanged(&m5, msnap), "%s", dg_last_error());
    ctx[1] = saved_ctx;
    dg_tensor wrong_idx = tu_alloc(DG_INT32, 1, (int64_t[]){c.b + 1});
    TU_CHECK_STATUS(dg_get_paged_mqa_logits_metadata(&v.tctx, 16, 4, &wrong_idx, &m5), DG_ERR_SHAPE);
    TU_CHECK(strstr(dg_last_error(), "'indices'") && tu_unchanged(&m5, msnap), "%s", dg_last_error());
    free(msnap), tu_free(&m5), tu_free(&m4), tu_free(&wrong_idx);
    free(snap), tu_free(&out), tu_free(&wb);
    free_case(&c), free_case(&v);
}

/* ---- fast kernels against the reference backend ---------------------------------------------- */

/* schedule_meta for the current dg_get_num_sms() (its row count follows the thread count). */
static void compute_meta(paged_case *c) {
    tu_free(&c->tmeta);
    c->tmeta = tu_alloc2(DG_INT32, dg_get_num_sms() + 1, 2);
    TU_CHECK_OK(dg_get_paged_mqa_logits_metadata(&c->tctx, (int)c->bk, dg_get_num_sms(),
                                                 c->has_idx ? &c->tidx : NULL, &c->tmeta));
}

/* got vs want: -inf exactly where want has it, calc_diff of the rest < tol. */
static void compare_outputs(const dg_tensor *got, const dg_tensor *want, double tol, const char *tag) {
    const int64_t rows = want->shape[0], cols = want->shape[1];
    float *g = calloc((size_t)(rows * cols) + 1, sizeof(float)), *w = calloc((size_t)(rows * cols) + 1, sizeof(float));
    int mask_bad = 0;
    size_t n = 0;
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) {
            const float a = get(got, i, j), b = get(want, i, j);
            if (isinf(a) || isinf(b)) {
                mask_bad += !(a == b);
                continue;
            }
            g[n] = a, w[n] = b, ++n;
        }
    const double diff = tu_calc_diff(g, w, n);
    /* Element-wise too (calc_diff hardly sees a few wrong entries): float sums of exact products
     * are within ~1e-5 of the reference relative to the value and the output's RMS. */
    double rms = 0;
    for (size_t i = 0; i < n; ++i)
        rms += (double)w[i] * w[i];
    rms = n ? sqrt(rms / (double)n) : 0;
    const int bf16 = want->dtype == DG_BFLOAT16;
    int far = 0;
    for (size_t i = 0; i < n; ++i)
        far += !(fabs((double)g[i] - w[i]) <= (bf16 ? 1.0 / 128 : 1e-5) * fabs(w[i]) + (bf16 ? 1e-4 : 1e-5) * rms);
    TU_CHECK(far == 0, "%s: %d entries differ from the reference beyond rounding", tag, far);
    TU_CHECK(mask_bad == 0, "%s: %d entries masked differently from the reference", tag, mask_bad);
    TU_CHECK(diff < tol, "%s: calc_diff vs the reference %g (tolerance %g)", tag, diff, tol);
    free(g), free(w);
}

/*
 * Every ISA the CPU has (AMX included), 2 and 1 threads and a repeat, against the reference
 * backend: masks equal, calc_diff < 5e-6 (BF16 logits 3e-5), the three runs bitwise equal.
 * block_kv = 300 makes contexts longer than one work item (768 positions) and not multiples of
 * the panel; heads not a multiple of 16 or 64; head dims not a multiple of 32 (d = 1, 40, 100);
 * 1-D and 2-D context lengths, next_n 1 to 3, varlen.
 */
static void test_fast_vs_reference(void) {
    static const struct { int64_t b, n, h, d, bk, pad; int fmt, bf16, lens_2d; } cases[] = {
        {3, 2, 20, 64, 300, 0, 0, 0, 0}, {4, 1, 70, 128, 64, 4, 0, 1, 0}, {3, 2, 17, 32, 300, 0, 0, 0, 1},
        {3, 1, 33, 128, 300, 0, 1, 0, 0}, {2, 2, 5, 64, 48, 8, 1, 1, 1}, {3, 2, 3, 40, 7, 0, 0, 0, 0},
        {2, 3, 48, 100, 64, 0, 0, 0, 1},  {3, 1, 16, 1, 20, 4, 0, 1, 0},  {2, 1, 64, 96, 512, 0, 0, 0, 0},
        {3, 1, 33, 128, 300, 0, 2, 0, 0}, {2, 2, 5, 96, 48, 8, 2, 1, 1},  {2, 3, 7, 32, 7, 4, 2, 0, 0},
    };
    const dg_isa saved_isa = dg_get_isa();
    const int saved_sms = dg_get_num_sms();
    const dg_backend saved_backend = dg_get_backend();
    for (size_t k = 0; k < sizeof cases / sizeof cases[0] + 1; ++k) {
        tu_rng rng = {k + 601};
        paged_case c;
        const int runs[3] = {2, 1, 3};
        if (k < sizeof cases / sizeof cases[0])
            make_case(&c, &rng, cases[k].b, cases[k].n, cases[k].h, cases[k].d, cases[k].bk, cases[k].fmt,
                      cases[k].bf16, cases[k].lens_2d, NULL, 0, cases[k].pad);
        else /* varlen */
            make_case(&c, &rng, 0, 1, 24, 64, 300, 0, 0, 1, runs, 3, 0);
        dg_tensor ref = {0};
        ref.dtype = c.bf16 ? DG_BFLOAT16 : DG_FLOAT32;
        compute_meta(&c);
        TU_CHECK_OK(run(&c, 1, &ref));
        ref.data = malloc(dg_tensor_nbytes(&ref) + 1);
        dg_set_backend(DG_BACKEND_REFERENCE);
        TU_CHECK_OK(run(&c, 1, &ref));
        dg_set_backend(DG_BACKEND_AUTO); /* the fast kernels, whatever DG_BACKEND says */
        const size_t bytes = dg_tensor_nbytes(&ref);
        for (int isa = DG_ISA_GENERIC; isa <= DG_ISA_AMX; ++isa) {
            if (dg_set_isa((dg_isa)isa) != DG_OK)
                continue;
            char tag[160];
            snprintf(tag, sizeof tag, "fast %s: B=%lld N=%lld H=%lld D=%lld bk=%lld fmt=%d bf16=%d 2d=%d idx=%d",
                     dg_isa_name((dg_isa)isa), (long long)c.b, (long long)c.n, (long long)c.h, (long long)c.d,
                     (long long)c.bk, c.fp4 + 2 * (c.mx && !c.fp4), c.bf16, c.lens_2d, c.has_idx);
            dg_tensor out[3];
            for (int r = 0; r < 3; ++r) {
                out[r] = ref;
                out[r].data = malloc(bytes + 1);
                memset(out[r].data, 0x5a, bytes);
                dg_set_num_sms(r == 1 ? 1 : 2);
                compute_meta(&c);
                TU_CHECK_OK(run(&c, 1, &out[r]));
            }
            compare_outputs(&out[0], &ref, c.bf16 ? 3e-5 : 5e-6, tag);
            TU_CHECK(memcmp(out[0].data, out[1].data, bytes) == 0, "%s: 2 threads == 1 thread bitwise", tag);
            TU_CHECK(memcmp(out[0].data, out[2].data, bytes) == 0, "%s: repeat bitwise", tag);
            for (int r = 0; r < 3; ++r)
                free(out[r].data);
        }
        dg_set_isa(saved_isa);
        dg_set_num_sms(saved_sms);
        free(ref.data);
        free_case(&c);
    }
    dg_set_backend(saved_backend);
}

/* FLOAT16 weights (DeepGEMM 2.8): bit for bit the logits of float32 weights of the same values,
 * for every format and both logits dtypes, on the reference and every ISA level (the MX
 * formats with rows padded, as upstream pads them; FP8 takes contiguous weights). */
static void test_f16_weights(void) {
    const dg_isa saved_isa = dg_get_isa();
    const dg_backend saved_backend = dg_get_backend();
    for (int fmt = 0; fmt < 3; ++fmt) {
        tu_rng rng = {(uint64_t)(fmt + 91)};
        paged_case c;
        make_case(&c, &rng, 3, 2, 4, 64, 16, fmt, 0, 0, NULL, 0, 0);
        TU_CHECK_OK(dg_get_paged_mqa_logits_metadata(&c.tctx, (int)c.bk, dg_get_num_sms(), NULL, &c.tmeta));
        dg_tensor w16 = tu_f16_copy(c.tw.data, c.b * c.n, c.h, fmt ? 8 : c.h, 1.0f);
        const dg_tensor tw32 = c.tw;
        for (int be = 0; be < 2; ++be) {
            dg_set_backend(be ? DG_BACKEND_AUTO : DG_BACKEND_REFERENCE);
            for (int isa = be ? DG_ISA_GENERIC : DG_ISA_AMX; isa <= DG_ISA_AMX; ++isa) {
                if (be && dg_set_isa((dg_isa)isa) != DG_OK)
                    continue;
                for (int bf = 0; bf < 2; ++bf) {
                    dg_tensor a = {0};
                    a.dtype = bf ? DG_BFLOAT16 : DG_FLOAT32;
                    c.tw = tw32;
                    TU_CHECK_OK(run(&c, 1, &a));
                    const size_t bytes = dg_tensor_nbytes(&a);
                    dg_tensor b = a;
                    a.data = calloc(bytes + 1, 1), b.data = calloc(bytes + 1, 1);
                    TU_CHECK_OK(run(&c, 1, &a));
                    c.tw = w16;
                    TU_CHECK_OK(run(&c, 1, &b));
                    TU_CHECK(memcmp(a.data, b.data, bytes) == 0,
                             "paged: float16 weights == float32 weights bitwise (fmt %d, %s logits, %s)", fmt,
                             dg_dtype_name(a.dtype), be ? dg_isa_name(dg_get_isa()) : "reference");
                    free(a.data), free(b.data);
                }
            }
            dg_set_isa(saved_isa);
        }
        c.tw = tw32;
        tu_free(&w16);
        free_case(&c);
    }
    dg_set_backend(saved_backend);
}

int main(void) {
    static const struct {
        int64_t b, n, h, d, bk, pad;
        int fmt, bf16, lens_2d, acc;
    } cases[] = {
        {4, 1, 4, 32, 16, 0, 0, 0, 0, 1},  {3, 2, 4, 64, 16, 8, 0, 0, 0, 0}, {5, 2, 2, 128, 32, 0, 0, 0, 1, 0},
        {3, 2, 4, 64, 8, 0, 0, 1, 0, 1},   {4, 1, 8, 128, 16, 4, 1, 0, 0, 1}, {3, 2, 2, 64, 16, 0, 1, 1, 1, 1},
        {2, 3, 2, 32, 4, 0, 0, 0, 0, 0},   {1, 1, 1, 32, 1, 0, 1, 0, 1, 0},  {4, 1, 8, 128, 16, 4, 2, 0, 0, 1},
        {3, 2, 2, 64, 16, 0, 2, 1, 1, 1},  {1, 1, 1, 32, 1, 0, 2, 0, 1, 0},
    };
    char tag[128];
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; ++k) {
        tu_rng rng = {k + 21};
        paged_case c;
        make_case(&c, &rng, cases[k].b, cases[k].n, cases[k].h, cases[k].d, cases[k].bk, cases[k].fmt, cases[k].bf16,
                  cases[k].lens_2d, NULL, 0, cases[k].pad);
        snprintf(tag, sizeof tag, "B=%lld N=%lld H=%lld D=%lld bk=%lld fmt=%d bf16=%d 2d=%d", (long long)c.b,
                 (long long)c.n, (long long)c.h, (long long)c.d, (long long)c.bk, cases[k].fmt, c.bf16, c.lens_2d);
        check_case(&c, tag, cases[k].acc);
        for (int sms = 1; sms <= 9; sms += 4)
            check_metadata(&c, sms, tag);
        check_metadata(&c, 200, tag);
        free_case(&c);
    }
    /* Variable-length batches through indices. */
    const int runs[4] = {3, 1, 2, 4};
    for (int fmt = 0; fmt <= 2; ++fmt) {
        tu_rng rng = {(uint64_t)(77 + fmt)};
        paged_case c;
        make_case(&c, &rng, 0, 1, 4, 64, 16, fmt, 0, 1, runs, 4, 0);
        snprintf(tag, sizeof tag, "varlen fmt=%d", fmt);
        check_case(&c, tag, 0);
        for (int sms = 1; sms <= 9; sms += 4)
            check_metadata(&c, sms, tag);
        free_case(&c);
    }
    test_bad_inputs();
    test_fast_vs_reference();
    test_f16_weights();
    return tu_finish();
}
