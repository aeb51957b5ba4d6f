/* ref_mqa.c - reference MQA logits and paged MQA logits (see ref_mqa.h for the numerics). */
#include "reference/ref_mqa.h"

#include <math.h>
#include <string.h>

/* ---- shared pieces ----------------------------------------------------------------------- */

/* Rounds a double once to what dg_store_float writes for `dtype`. For BF16 the double is first
 * rounded to 8 significant bits (nearest even) so that the float conversion and the BF16 cast
 * that follow are exact: one rounding, not two. Values below FP32's normal range (BF16
 * subnormals) go through float directly; the double rounding there is at most 2^-133. */
static float round_for_store(double v, dg_dtype dtype) {
    if (dtype != DG_BFLOAT16 || !isfinite(v) || fabs(v) < 0x1p-126)
        return (float)v;
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    const int drop = 52 - 7; /* double has 52 explicit mantissa bits, BF16 has 7 */
    const uint64_t lsb = (bits >> drop) & 1u;
    bits += ((uint64_t)1 << (drop - 1)) - 1 + lsb;
    bits &= ~(((uint64_t)1 << drop) - 1);
    memcpy(&v, &bits, sizeof v);
    return (float)v; /* exact, or +-inf past FP32's range as the BF16 cast would give */
}

static void store(const dg_tensor *t, int64_t i, int64_t j, double v) {
    dg_store_float(t, dg_ptr2(t, i, j), round_for_store(v, t->dtype));
}

static void store_neg_inf(const dg_tensor *t, int64_t i, int64_t j) {
    dg_store_float(t, dg_ptr2(t, i, j), -INFINITY);
}

static uint32_t load_u32(const void *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Byte g of a packed UE8M0 word as a float: the scale of elements [32g, 32g + 32). */
static double packed_scale(uint32_t word, int64_t elem) {
    return dg_ue8m0_to_float((uint8_t)(word >> (8 * (elem / 32))));
}

/* Dequantizes one row of d values: E4M3 bytes (unscaled, or with `mx` times their per-32
 * UE8M0 scales from `sf_word`), or packed E2M1 codes times their scales from `sf_word`. */
static void dequant_row(double *out, const uint8_t *row, int64_t d, int fp4, int mx, uint32_t sf_word) {
    for (int64_t k = 0; k < d; ++k) {
        if (!fp4) {
            out[k] = (double)dg_e4m3_to_float(row[k]) * (mx ? packed_scale(sf_word, k) : 1.0);
        } else {
            const uint8_t byte = row[k / 2];
            const uint8_t code = (k & 1) ? (uint8_t)(byte >> 4) : (uint8_t)(byte & 15);
            out[k] = (double)dg_e2m1_to_float(code) * packed_scale(sf_word, k);
        }
    }
}

/* sum_h w[h] * relu(q[h, :] . k[:]), in double, d then h in increasing order. */
static double head_reduce(const double *q, const double *w, const double *k, int64_t h, int64_t d) {
    double sum = 0.0;
    for (int64_t hh = 0; hh < h; ++hh) {
        double dot = 0.0;
        for (int64_t kk = 0; kk < d; ++kk)
            dot += q[hh * d + kk] * k[kk];
        if (dot > 0.0)
            sum += dot * w[hh];
    }
    return sum;
}

/* Loads the H rows of query token `row` (q viewed as [rows, H, D-bytes]) and its weights. */
static void load_query(double *qd, double *w, const dg_tensor *q, const dg_tensor *q_sf, const dg_tensor *weights,
                       int64_t row, int64_t h, int64_t d, int fp4, int mx) {
    const int64_t row_bytes = fp4 ? d / 2 : d;
    const uint8_t *base = (const uint8_t *)q->data + row * h * row_bytes; /* contiguous */
    for (int64_t hh = 0; hh < h; ++hh) {
        const uint32_t sf = mx ? ((const uint32_t *)q_sf->data)[row * h + hh] : 0u;
        dequant_row(qd + hh * d, base + hh * row_bytes, d, fp4, mx, sf);
        w[hh] = dg_load_float(weights, dg_ptr2(weights, row, hh));
    }
}

/* ---- contiguous KV ------------------------------------------------------------------------ */

dg_status dg_ref_mqa_logits(const dg_mqa_problem *p) {
    const int64_t h = p->h, d = p->d;
    const int64_t row_bytes = p->fp4 ? d / 2 : d;
    const int64_t width = p->max_seqlen_k > 0 ? p->max_seqlen_k : p->sk;
    if (p->s == 0) /* no query row: nothing to write, and h * d may be huge (tests/fuzz) */
        return DG_OK;
    double *qd = dg_malloc((size_t)(h * d + h + d) * sizeof(double));
    DG_CHECK(qd != NULL, DG_ERR_ALLOC, "no memory for a %lld x %lld query buffer", (long long)h, (long long)d);
    double *w = qd + h * d, *kd = w + h;
    for (int64_t i = 0; i < p->s; ++i) {
        load_query(qd, w, p->q, p->q_sf, p->weights, i, h, d, p->fp4, p->mx);
        const int64_t ks = p->ks[i], ke = p->ke[i];
        for (int64_t j = ks; j < ke; ++j) {
            const uint8_t *kv_row = (const uint8_t *)p->kv->data + j * row_bytes;
            double v;
            if (p->mx) {
                dequant_row(kd, kv_row, d, p->fp4, 1, ((const uint32_t *)p->kv_sf->data)[j]);
                v = head_reduce(qd, w, kd, h, d);
            } else {
                dequant_row(kd, kv_row, d, 0, 0, 0u);
                v = head_reduce(qd, w, kd, h, d) * (double)((const float *)p->kv_sf->data)[j];
            }
            store(p->logits, i, p->max_seqlen_k > 0 ? j - ks : j, v);
        }
        if (!p->clean_logits)
            continue;
        /* Full logits: -inf outside [ks, ke). Compressed: -inf past the range's length. */
        if (p->max_seqlen_k > 0) {
            for (int64_t c = ke - ks; c < width; ++c)
                store_neg_inf(p->logits, i, c);
        } else {
            for (int64_t j = 0; j < width; ++j)
                if (j < ks || j >= ke)
                    store_neg_inf(p->logits, i, j);
        }
    }
    dg_free(qd);
    return DG_OK;
}

/* ---- paged KV ----------------------------------------------------------------------------- */

int64_t dg_paged_visible_len(const dg_paged_mqa_problem *p, int64_t r) {
    const int64_t b = r / p->next_n, t = r % p->next_n;
    if (p->context_lens_2d)
        return p->context_lens[r];
    const int64_t n = (int64_t)p->context_lens[b] - p->next_n + t + 1; /* p <= ctx - next_n + t */
    return n < 0 ? 0 : n;
}

/* Dequantizes token `pos` of sequence row `b` from the fused cache; returns the FP8 scale
 * (1 for MXFP4 and MXFP8, whose scales are folded into the values). */
static double load_cache_row(double *out, const dg_paged_mqa_problem *p, int64_t b, int64_t pos) {
    const int64_t blk = p->block_table[b * p->block_table_stride + pos / p->block_kv];
    const int64_t tok = pos % p->block_kv;
    const uint8_t *base = p->cache + blk * p->block_stride;
    const int64_t row_bytes = p->fp4 ? p->d / 2 : p->d;
    const uint8_t *sf = base + p->block_kv * row_bytes + tok * 4; /* scales follow the values */
    if (p->mx) {
        dequant_row(out, base + tok * row_bytes, p->d, p->fp4, 1, load_u32(sf));
        return 1.0;
    }
    dequant_row(out, base + tok * row_bytes, p->d, 0, 0, 0u);
    float scale;
    memcpy(&scale, sf, sizeof scale);
    return scale;
}

dg_status dg_ref_paged_mqa_logits(const dg_paged_mqa_problem *p) {
    const int64_t h = p->h, d = p->d, rows = p->batch * p->next_n;
    if (rows == 0) /* no query row: nothing to write, and h * d may be huge */
        return DG_OK;
    double *qd = dg_malloc((size_t)(h * d + h + d) * sizeof(double));
    DG_CHECK(qd != NULL, DG_ERR_ALLOC, "no memory for a %lld x %lld query buffer", (long long)h, (long long)d);
    double *w = qd + h * d, *kd = w + h;
    for (int64_t r = 0; r < rows; ++r) {
        load_query(qd, w, p->q, p->q_sf, p->weights, r, h, d, p->fp4, p->mx);
        const int64_t b = r / p->next_n, n = dg_paged_visible_len(p, r);
        for (int64_t pos = 0; pos < n; ++pos) {
            const double scale = load_cache_row(kd, p, b, pos);
            store(p->logits, r, pos, head_reduce(qd, w, kd, h, d) * scale);
        }
        if (p->clean_logits)
            for (int64_t pos = n; pos < p->max_context_len; ++pos)
                store_neg_inf(p->logits, r, pos);
    }
    dg_free(qd);
    return DG_OK;
}

/* ---- sparse blocks ------------------------------------------------------------------------ */

int dg_sparse_token(const dg_sparse_mqa_problem *p, int64_t i, int64_t j, int64_t o, const uint8_t **row,
                    const uint8_t **sf) {
    const int32_t *slot = p->slots + (i * p->nmsb + j) * 2;
    if (slot[0] == DG_SPARSE_NO_BLOCK)
        return 0;
    const int64_t t = (int64_t)slot[0] + o;
    if (t < p->rows[i * 2] || t >= p->rows[i * 2 + 1])
        return 0;
    dg_sparse_token_at(p, slot, o, row, sf);
    return 1;
}

void dg_sparse_token_at(const dg_sparse_mqa_problem *p, const int32_t *slot, int64_t o, const uint8_t **row,
                        const uint8_t **sf) {
    const int64_t t = (int64_t)slot[0] + o, row_bytes = p->fp4 ? p->d / 2 : p->d;
    if (!p->paged) {
        *row = (const uint8_t *)p->kv->data + t * row_bytes;
        *sf = (const uint8_t *)p->kv_sf->data + t * 4;
        return;
    }
    const uint8_t *base = p->cache + (int64_t)slot[1] * p->page_stride;
    const int64_t tok = t % p->page_kv;
    *row = base + tok * row_bytes;
    *sf = base + p->page_kv * row_bytes + tok * 4;
}

dg_status dg_ref_sparse_mqa_logits(const dg_sparse_mqa_problem *p) {
    const int64_t h = p->h, d = p->d;
    if (p->s == 0)
        return DG_OK;
    double *qd = dg_malloc((size_t)(h * d + h + d) * sizeof(double));
    DG_CHECK(qd != NULL, DG_ERR_ALLOC, "no memory for a %lld x %lld query buffer", (long long)h, (long long)d);
    double *w = qd + h * d, *kd = w + h;
    for (int64_t i = 0; i < p->s; ++i) {
        load_query(qd, w, p->q, p->q_sf, p->weights, i, h, d, p->fp4, p->mx);
        for (int64_t j = 0; j < p->nmsb; ++j)
            for (int64_t o = 0; o < p->sbkv; ++o) {
                const uint8_t *row, *sf;
                const int64_t col = j * p->sbkv + o;
                if (!dg_sparse_token(p, i, j, o, &row, &sf)) {
                    store_neg_inf(p->logits, i, col);
                    continue;
                }
                if (p->mx) {
                    dequant_row(kd, row, d, p->fp4, 1, load_u32(sf));
                    store(p->logits, i, col, head_reduce(qd, w, kd, h, d));
                } else {
                    float scale;
                    memcpy(&scale, sf, sizeof scale);
                    dequant_row(kd, row, d, 0, 0, 0u);
                    store(p->logits, i, col, head_reduce(qd, w, kd, h, d) * (double)scale);
                }
            }
    }
    dg_free(qd);
    return DG_OK;
}
