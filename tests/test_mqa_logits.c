/*
 * test_mqa_logits.c - dg_fp8_mqa_logits / dg_fp8_fp4_mqa_logits against a naive formula
 * written here (SPEC 5: relu(q . (kv * kv_sf)) summed over heads with weights), DeepGEMM's
 * calc_diff thresholds against unquantized math, masks, compressed output, query form,
 * determinism and bad arguments.
 */
#include "test_util.h"

#include "engine/engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* One problem: original floats, quantized tensors, and the dequantized copies. */
typedef struct mqa_case {
    int64_t s, sk, h, d;
    int fp4, mx, bf16_weights; /* fp4: MXFP4 (packed E2M1); mx: per-32 UE8M0 scales (MXFP4, MXFP8) */
    float *q, *kv, *w;      /* unquantized [S*H*D], [SK*D], [S*H] (w already rounded if BF16) */
    float *qd, *kvd;        /* dequantized, kv including its scale */
    dg_tensor tq, tqsf, tkv, tkvsf, tw, tks, tke;
} mqa_case;

/* Per-row FP8 cast as DeepGEMM's per_custom_dims_cast_to_fp8(kv, (0,)): sf = amax / 448. */
static void quant_fp8_rows(const float *x, int64_t rows, int64_t d, uint8_t *out, float *sf, float *deq) {
    for (int64_t r = 0; r < rows; ++r) {
        float amax = 1e-4f;
        for (int64_t k = 0; k < d; ++k)
            amax = fmaxf(amax, fabsf(x[r * d + k]));
        sf[r] = amax / 448.0f;
        const float inv = 1.0f / sf[r];
        for (int64_t k = 0; k < d; ++k) {
            out[r * d + k] = dg_float_to_e4m3(x[r * d + k] * inv);
            deq[r * d + k] = dg_e4m3_to_float(out[r * d + k]) * sf[r];
        }
    }
}

/* Per-32 FP4 cast with UE8M0 scales packed into one int32 per row (padding bytes = 2^0). */
static void quant_fp4_rows(const float *x, int64_t rows, int64_t d, uint8_t *out, int32_t *sf, float *deq) {
    for (int64_t r = 0; r < rows; ++r) {
        uint32_t word = 0x7f7f7f7fu;
        for (int64_t g = 0; g < d / 32; ++g) {
            float amax = 1e-4f;
            for (int64_t k = g * 32; k < g * 32 + 32; ++k)
                amax = fmaxf(amax, fabsf(x[r * d + k]));
            const float scale = dg_ceil_to_ue8m0(amax / 6.0f);
            word = (word & ~(0xffu << (8 * g))) | ((uint32_t)dg_float_to_ue8m0(amax / 6.0f) << (8 * g));
            for (int64_t k = g * 32; k < g * 32 + 32; ++k) {
                const uint8_t code = dg_float_to_e2m1(x[r * d + k] * (1.0f / scale));
                uint8_t *byte = &out[(r * d + k) / 2];
                *byte = (k & 1) ? (uint8_t)((*byte & 15) | (code << 4)) : (uint8_t)((*byte & 0xf0) | code);
                deq[r * d + k] = dg_e2m1_to_float(code) * scale;
            }
        }
        sf[r] = (int32_t)word;
    }
}

/* Per-32 MXFP8 cast as DeepGEMM's per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=32,
 * use_packed_ue8m0=True): scale = ceil_to_ue8m0(amax / 448), one packed int32 per row. */
static void quant_mxfp8_rows(const float *x, int64_t rows, int64_t d, uint8_t *out, int32_t *sf, float *deq) {
    for (int64_t r = 0; r < rows; ++r) {
        uint32_t word = 0x7f7f7f7fu;
        for (int64_t g = 0; g < d / 32; ++g) {
            float amax = 1e-4f;
            for (int64_t k = g * 32; k < g * 32 + 32; ++k)
                amax = fmaxf(amax, fabsf(x[r * d + k]));
            const float scale = dg_ceil_to_ue8m0(amax / 448.0f);
            word = (word & ~(0xffu << (8 * g))) | ((uint32_t)dg_float_to_ue8m0(amax / 448.0f) << (8 * g));
            for (int64_t k = g * 32; k < g * 32 + 32; ++k) {
                out[r * d + k] = dg_float_to_e4m3(x[r * d + k] * (1.0f / scale));
                deq[r * d + k] = dg_e4m3_to_float(out[r * d + k]) * scale;
            }
        }
        sf[r] = (int32_t)word;
    }
}

/* fmt: 0 FP8 (float kv scales), 1 MXFP4, 2 MXFP8. */
static void make_case(mqa_case *c, tu_rng *rng, int64_t s, int64_t sk, int64_t h, int64_t d, int fmt,
                      int bf16_weights) {
    memset(c, 0, sizeof *c);
    const int fp4 = fmt == 1;
    c->s = s, c->sk = sk, c->h = h, c->d = d, c->fp4 = fp4, c->mx = fmt != 0, c->bf16_weights = bf16_weights;
    c->q = malloc(sizeof(float) * (size_t)(s * h * d + 1));
    c->kv = malloc(sizeof(float) * (size_t)(sk * d + 1));
    c->w = malloc(sizeof(float) * (size_t)(s * h + 1));
    c->qd = malloc(sizeof(float) * (size_t)(s * h * d + 1));
    c->kvd = malloc(sizeof(float) * (size_t)(sk * d + 1));
    tu_fill_normal(rng, c->q, (size_t)(s * h * d), 1.0f);
    tu_fill_normal(rng, c->kv, (size_t)(sk * d), 1.0f);
    tu_fill_normal(rng, c->w, (size_t)(s * h), 1.0f);
    const int64_t db = fp4 ? d / 2 : d;
    c->tq = tu_alloc3(fp4 ? DG_FP4_E2M1X2 : DG_FLOAT8_E4M3, s, h, db);
    c->tkv = tu_alloc2(fp4 ? DG_FP4_E2M1X2 : DG_FLOAT8_E4M3, sk, db);
    const int64_t sk1[1] = {sk}, s1[1] = {s};
    c->tkvsf = tu_alloc(c->mx ? DG_INT32 : DG_FLOAT32, 1, sk1);
    if (fp4) {
        c->tqsf = tu_alloc2(DG_INT32, s, h);
        quant_fp4_rows(c->q, s * h, d, c->tq.data, c->tqsf.data, c->qd);
        quant_fp4_rows(c->kv, sk, d, c->tkv.data, c->tkvsf.data, c->kvd);
    } else if (c->mx) {
        c->tqsf = tu_alloc2(DG_INT32, s, h);
        quant_mxfp8_rows(c->q, s * h, d, c->tq.data, c->tqsf.data, c->qd);
        quant_mxfp8_rows(c->kv, sk, d, c->tkv.data, c->tkvsf.data, c->kvd);
    } else {
        for (int64_t i = 0; i < s * h * d; ++i) {
            ((uint8_t *)c->tq.data)[i] = dg_float_to_e4m3(c->q[i]);
            c->qd[i] = dg_e4m3_to_float(((uint8_t *)c->tq.data)[i]);
        }
        quant_fp8_rows(c->kv, sk, d, c->tkv.data, c->tkvsf.data, c->kvd);
    }
    c->tw = tu_alloc2(bf16_weights ? DG_BFLOAT16 : DG_FLOAT32, s, h);
    for (int64_t i = 0; i < s * h; ++i) {
        if (bf16_weights) {
            ((uint16_t *)c->tw.data)[i] = dg_float_to_bf16(c->w[i]);
            c->w[i] = dg_bf16_to_float(((uint16_t *)c->tw.data)[i]);
        } else {
            ((float *)c->tw.data)[i] = c->w[i];
        }
    }
    c->tks = tu_alloc(DG_INT32, 1, s1);
    c->tke = tu_alloc(DG_INT32, 1, s1);
}

/* Random ranges: some empty, some touching 0 or SK, some full. */
static void random_ranges(mqa_case *c, tu_rng *rng) {
    int32_t *ks = c->tks.data, *ke = c->tke.data;
    for (int64_t i = 0; i < c->s; ++i) {
        const int kind = (int)(i % 5);
        int64_t a = tu_randint(rng, 0, c->sk), b = tu_randint(rng, 0, c->sk);
        if (a > b) { const int64_t t = a; a = b; b = t; }
        if (kind == 1) b = a;           /* empty */
        if (kind == 2) a = 0;           /* touches the start */
        if (kind == 3) b = c->sk;       /* touches the end */
        if (kind == 4 && i % 10 == 4) a = 0, b = c->sk;
        ks[i] = (int32_t)a, ke[i] = (int32_t)b;
    }
}

static void free_case(mqa_case *c) {
    free(c->q), free(c->kv), free(c->w), free(c->qd), free(c->kvd);
    tu_free(&c->tq), tu_free(&c->tqsf), tu_free(&c->tkv), tu_free(&c->tkvsf), tu_free(&c->tw);
    tu_free(&c->tks), tu_free(&c->tke);
}

/* The SPEC's formula on given float arrays; also returns sum |terms| for a tolerance. */
static double naive(const mqa_case *c, const float *q, const float *kv, int64_t i, int64_t j, double *absum) {
    double sum = 0, mag = 0;
    for (int64_t h = 0; h < c->h; ++h) {
        double dot = 0, adot = 0;
        for (int64_t k = 0; k < c->d; ++k) {
            dot += (double)q[(i * c->h + h) * c->d + k] * kv[j * c->d + k];
            adot += fabs((double)q[(i * c->h + h) * c->d + k] * kv[j * c->d + k]);
        }
        sum += (dot > 0 ? dot : 0) * c->w[i * c->h + h];
        mag += adot * fabs(c->w[i * c->h + h]);
    }
    if (absum)
        *absum = mag;
    return sum;
}

static dg_status run(const mqa_case *c, int clean, int max_k, dg_tensor *out) {
    return dg_fp8_fp4_mqa_logits(&c->tq, c->mx ? &c->tqsf : NULL, &c->tkv, &c->tkvsf, &c->tw, &c->tks, &c->tke,
                                 clean, max_k, out);
}

static float get(const dg_tensor *t, int64_t i, int64_t j) {
    const int64_t off = i * t->strides[0] + j;
    return t->dtype == DG_FLOAT32 ? ((float *)t->data)[off] : dg_bf16_to_float(((uint16_t *)t->data)[off]);
}

/* Full logits with the query form's padded strides; checks values, masks, determinism and
 * the compressed form against it. */
static void check_case(mqa_case *c, dg_dtype logits_dt, const char *tag) {
    const int32_t *ks = c->tks.data, *ke = c->tke.data;
    dg_tensor out = {0};
    out.dtype = logits_dt;
    TU_CHECK_OK(run(c, 1, 0, &out));
    TU_CHECK(out.shape[0] == c->s && out.shape[1] == c->sk && out.strides[1] == 1, "%s: query shape", tag);
    out.data = calloc(dg_tensor_nbytes(&out) + 1, 1);
    TU_CHECK_OK(run(c, 1, 0, &out));
    const double rel = logits_dt == DG_BFLOAT16 ? 1.0 / 128 : 3e-7;
    int bad = 0, mask_bad = 0;
    for (int64_t i = 0; i < c->s; ++i)
        for (int64_t j = 0; j < c->sk; ++j) {
            const float got = get(&out, i, j);
            if (j < ks[i] || j >= ke[i]) {
                mask_bad += !(isinf(got) && got < 0);
                continue;
            }
            double mag;
            const double want = naive(c, c->qd, c->kvd, i, j, &mag);
            bad += !(fabs(got - want) <= rel * fabs(want) + 2e-7 * mag); /* + float dequant error */
        }
    TU_CHECK(bad == 0, "%s: %d entries differ from the naive formula", tag, bad);
    TU_CHECK(mask_bad == 0, "%s: %d out-of-range entries are not -inf", tag, mask_bad);

    /* Bitwise identical on repeat. */
    dg_tensor again = out;
    again.data = calloc(dg_tensor_nbytes(&out) + 1, 1);
    TU_CHECK_OK(run(c, 1, 0, &again));
    TU_CHECK(memcmp(again.data, out.data, dg_tensor_nbytes(&out)) == 0, "%s: repeat is bitwise equal", tag);

    /* clean_logits = 0: out-of-range entries keep the sentinel, in-range ones are the same bits. */
    memset(again.data, 0x5a, dg_tensor_nbytes(&again));
    TU_CHECK_OK(run(c, 0, 0, &again));
    const size_t es = dg_dtype_size(logits_dt);
    int untouched_bad = 0, same_bad = 0;
    for (int64_t i = 0; i < c->s; ++i)
        for (int64_t j = 0; j < c->sk; ++j) {
            const char *a = (char *)again.data + (i * again.strides[0] + j) * (int64_t)es;
            const char *b = (char *)out.data + (i * out.strides[0] + j) * (int64_t)es;
            if (j < ks[i] || j >= ke[i])
                untouched_bad += a[0] != 0x5a || a[es - 1] != 0x5a;
            else
                same_bad += memcmp(a, b, es) != 0;
        }
    TU_CHECK(untouched_bad == 0 && same_bad == 0, "%s: no-clean run (%d untouched, %d differ)", tag, untouched_bad,
             same_bad);

    /* Compressed: column c is kv row ks + c. */
    int max_len = 0;
    for (int64_t i = 0; i < c->s; ++i)
        max_len = ke[i] - ks[i] > max_len ? ke[i] - ks[i] : max_len;
    if (max_len > 0) {
        for (int clean = 0; clean <= 1; ++clean) {
            dg_tensor cmp = {0};
            cmp.dtype = logits_dt;
            TU_CHECK_OK(run(c, clean, max_len, &cmp));
            TU_CHECK(cmp.shape[1] == max_len, "%s: compressed query width", tag);
            cmp.data = malloc(dg_tensor_nbytes(&cmp) + 1);
            memset(cmp.data, 0x5a, dg_tensor_nbytes(&cmp));
            TU_CHECK_OK(run(c, clean, max_len, &cmp));
            int cbad = 0;
            for (int64_t i = 0; i < c->s; ++i)
                for (int64_t col = 0; col < max_len; ++col) {
                    const char *a = (char *)cmp.data + (i * cmp.strides[0] + col) * (int64_t)es;
                    if (col < ke[i] - ks[i])
                        cbad += memcmp(a, (char *)out.data + (i * out.strides[0] + ks[i] + col) * (int64_t)es, es) != 0;
                    else if (clean)
                        cbad += !(isinf(get(&cmp, i, col)) && get(&cmp, i, col) < 0);
                    else
                        cbad += a[0] != 0x5a;
                }
            TU_CHECK(cbad == 0, "%s: compressed clean=%d has %d bad entries", tag, clean, cbad);
            free(cmp.data);
        }
    }
    free(again.data);
    free(out.data);
}

/* DeepGEMM's accuracy check on one case: calc_diff against unquantized math (masked to 0). */
static void check_accuracy(int fmt, int bf16) {
    tu_rng rng = {fmt * 7 + bf16 + 100};
    mqa_case c;
    make_case(&c, &rng, 32, 128, 8, fmt ? 128 : 64, fmt, bf16);
    random_ranges(&c, &rng);
    dg_tensor out = dg_tensor_2d(calloc((size_t)(c.s * c.sk), 4), bf16 ? DG_BFLOAT16 : DG_FLOAT32, c.s, c.sk);
    TU_CHECK_OK(run(&c, 1, 0, &out));
    float *got = calloc((size_t)(c.s * c.sk), sizeof(float));
    float *ref = calloc((size_t)(c.s * c.sk), sizeof(float));
    float *sim = calloc((size_t)(c.s * c.sk), sizeof(float));
    for (int64_t i = 0; i < c.s; ++i)
        for (int64_t j = ((int32_t *)c.tks.data)[i]; j < ((int32_t *)c.tke.data)[i]; ++j) {
            got[i * c.sk + j] = get(&out, i, j);
            ref[i * c.sk + j] = (float)naive(&c, c.q, c.kv, i, j, NULL);
            sim[i * c.sk + j] = (float)naive(&c, c.qd, c.kvd, i, j, NULL);
        }
    const double diff = tu_calc_diff(got, ref, (size_t)(c.s * c.sk));
    const double sdiff = tu_calc_diff(got, sim, (size_t)(c.s * c.sk));
    TU_CHECK(diff < (fmt ? 0.02 : 1e-3), "fmt=%d bf16=%d: calc_diff vs unquantized %g", fmt, bf16, diff);
    TU_CHECK(sdiff < (bf16 ? 3e-5 : 5e-6), "fmt=%d bf16=%d: calc_diff vs dequantized %g", fmt, bf16, sdiff);
    TU_CHECK(diff > 0, "the quantized result is not the unquantized one (the check can fail)");
    free(got), free(ref), free(sim), free(out.data);
    free_case(&c);
}

/* ---- fast kernels against the reference backend ---------------------------------------------- */

/* got vs want over [rows][cols]: -inf exactly where want has it, calc_diff of the rest < tol. */
static void compare_outputs(const dg_tensor *got, const dg_tensor *want, int64_t rows, int64_t cols, double tol,
                            const char *tag) {
    float *g = calloc((size_t)(rows * cols) + 1, sizeof(float)), *w = calloc((size_t)(rows * cols) + 1, sizeof(float));
    int mask_bad = 0;
    size_t n = 0;
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) {
            const float a = get(got, i, j), b = get(want, i, j);
            if (isinf(b) || isinf(a)) {
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

/* Causal ranges as in DeepGEMM's prefill test: [0, SK - S + i + 1), clipped to [0, SK]. */
static void causal_ranges(mqa_case *c) {
    for (int64_t i = 0; i < c->s; ++i) {
        int64_t e = c->sk - c->s + i + 1;
        e = e < 0 ? 0 : e;
        ((int32_t *)c->tks.data)[i] = 0, ((int32_t *)c->tke.data)[i] = (int32_t)(e > c->sk ? c->sk : e);
    }
}

/* max_k for a call: 0 (full rows), or with `compressed` the longest query range (at least 1). */
static int compressed_max_k(const mqa_case *c, int compressed) {
    int max_len = 0;
    for (int64_t i = 0; i < c->s; ++i) {
        const int len = ((int32_t *)c->tke.data)[i] - ((int32_t *)c->tks.data)[i];
        max_len = len > max_len ? len : max_len;
    }
    return compressed ? (max_len > 0 ? max_len : 1) : 0;
}

/*
 * Every ISA the CPU has (AMX included), 2 and 1 threads and a repeat: against the reference
 * backend (only float rounding differs: calc_diff < 5e-6, BF16 logits 3e-5), masks equal, and
 * the three runs bitwise equal. Shapes: heads not a multiple of 16 or 64 (1 to 70), head dims
 * 1 to 128 (tails inside a k step of 32), kv longer than one work item (768 rows), more tokens
 * than one prefill block, random (empty, edge-touching) and causal ranges, compressed logits.
 */
static void test_fast_vs_reference(void) {
    static const struct { int64_t s, sk, h, d; int fmt, bf16, causal, compressed; dg_dtype out; } cases[] = {
        {24, 800, 20, 64, 0, 0, 0, 0, DG_FLOAT32},  {9, 130, 70, 128, 0, 1, 1, 0, DG_BFLOAT16},
        {17, 820, 17, 32, 0, 0, 1, 1, DG_FLOAT32},  {13, 790, 33, 128, 1, 0, 0, 0, DG_FLOAT32},
        {11, 300, 5, 64, 1, 1, 0, 1, DG_BFLOAT16},  {6, 50, 3, 40, 0, 0, 0, 0, DG_FLOAT32},
        {19, 260, 48, 100, 0, 0, 1, 0, DG_FLOAT32}, {7, 140, 1, 1, 0, 1, 0, 1, DG_BFLOAT16},
        {40, 900, 16, 96, 0, 0, 0, 0, DG_FLOAT32},  {13, 790, 33, 128, 2, 0, 0, 0, DG_FLOAT32},
        {11, 300, 5, 64, 2, 1, 0, 1, DG_BFLOAT16},  {9, 130, 7, 96, 2, 0, 1, 0, DG_FLOAT32},
        {1, 40, 1, 32, 2, 0, 0, 0, DG_FLOAT32},
    };
    const dg_isa saved_isa = dg_get_isa();
    const int saved_sms = dg_get_num_sms();
    const dg_backend saved_backend = dg_get_backend();
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; ++k) {
        tu_rng rng = {k + 501};
        mqa_case c;
        make_case(&c, &rng, cases[k].s, cases[k].sk, cases[k].h, cases[k].d, cases[k].fmt, cases[k].bf16);
        if (cases[k].causal)
            causal_ranges(&c);
        else
            random_ranges(&c, &rng);
        const int max_k = compressed_max_k(&c, cases[k].compressed);
        const int64_t width = max_k > 0 ? max_k : c.sk;
        dg_tensor ref = tu_alloc2(cases[k].out, c.s, width), out[3];
        dg_set_backend(DG_BACKEND_REFERENCE);
        TU_CHECK_OK(run(&c, 1, max_k, &ref));
        dg_set_backend(DG_BACKEND_AUTO); /* the fast kernels, whatever DG_BACKEND says */
        for (int isa = DG_ISA_GENERIC; isa <= DG_ISA_AMX; ++isa) {
            if (dg_set_isa((dg_isa)isa) != DG_OK)
                continue;
            char tag[160];
            snprintf(tag, sizeof tag, "fast %s: S=%lld SK=%lld H=%lld D=%lld fmt=%d bf16w=%d causal=%d max_k=%d",
                     dg_isa_name((dg_isa)isa), (long long)c.s, (long long)c.sk, (long long)c.h, (long long)c.d,
                     cases[k].fmt, c.bf16_weights, cases[k].causal, max_k);
            for (int r = 0; r < 3; ++r) {
                out[r] = tu_alloc2(cases[k].out, c.s, width);
                tu_fill_bytes(&out[r], 0x5a);
                dg_set_num_sms(r == 1 ? 1 : 2);
                TU_CHECK_OK(run(&c, 1, max_k, &out[r]));
            }
            compare_outputs(&out[0], &ref, c.s, width, cases[k].out == DG_BFLOAT16 ? 3e-5 : 5e-6, tag);
            const size_t bytes = dg_tensor_nbytes(&ref);
            TU_CHECK(memcmp(out[0].data, out[1].data, bytes) == 0, "%s: 2 threads == 1 thread bitwise", tag);
            TU_CHECK(memcmp(out[0].data, out[2].data, bytes) == 0, "%s: repeat bitwise", tag);
            for (int r = 0; r < 3; ++r)
                tu_free(&out[r]);
        }
        dg_set_isa(saved_isa);
        dg_set_num_sms(saved_sms);
        tu_free(&ref);
        free_case(&c);
    }
    dg_set_backend(saved_backend);
}

/*
 * A logit's bits depend only on its inputs: the same query tokens at other positions (reversed,
 * after filler tokens: other work items and places in them) against the same kv rows moved by
 * `off` rows (other panels and lanes), at every ISA, must give bitwise the same logits. Odd head
 * counts and head dims (d tails inside a k step of 32) included.
 */
static void test_position_invariance(void) {
    static const struct { int64_t s, sk, h, d; int fmt; } cases[] = {
        {20, 300, 20, 64, 0}, {9, 150, 48, 100, 0}, {5, 90, 3, 33, 0}, {6, 120, 5, 64, 1}, {40, 200, 16, 1, 0},
        {7, 130, 9, 96, 2},
    };
    const dg_isa saved_isa = dg_get_isa();
    const int64_t off = 7, fill = 3;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; ++k) {
        tu_rng rng = {k + 901};
        mqa_case a;
        make_case(&a, &rng, cases[k].s, cases[k].sk, cases[k].h, cases[k].d, cases[k].fmt, 0);
        random_ranges(&a, &rng);
        const int64_t s = a.s, sk = a.sk, h = a.h, sb = s + fill, skb = sk + off;
        const int64_t qrow = a.fp4 ? h * a.d / 2 : h * a.d, kvrow = a.fp4 ? a.d / 2 : a.d;
        mqa_case b = a; /* the same shapes, B's own tensors */
        b.s = sb, b.sk = skb;
        b.tq = tu_alloc3(a.tq.dtype, sb, h, a.tq.shape[2]);
        b.tkv = tu_alloc2(a.tkv.dtype, skb, a.tkv.shape[1]);
        const int64_t skb1[1] = {skb}, sb1[1] = {sb};
        b.tkvsf = tu_alloc(a.tkvsf.dtype, 1, skb1);
        b.tqsf = a.mx ? tu_alloc2(DG_INT32, sb, h) : (dg_tensor){0};
        b.tw = tu_alloc2(DG_FLOAT32, sb, h);
        b.tks = tu_alloc(DG_INT32, 1, sb1);
        b.tke = tu_alloc(DG_INT32, 1, sb1);
        /* kv: `off` rows of A's tail, then A's rows */
        memcpy(b.tkv.data, (uint8_t *)a.tkv.data + (sk - off) * kvrow, (size_t)(off * kvrow));
        memcpy((uint8_t *)b.tkv.data + off * kvrow, a.tkv.data, (size_t)(sk * kvrow));
        memcpy(b.tkvsf.data, (uint8_t *)a.tkvsf.data + (sk - off) * 4, (size_t)(off * 4));
        memcpy((uint8_t *)b.tkvsf.data + off * 4, a.tkvsf.data, (size_t)(sk * 4));
        /* B's token i: a filler (A's token 0, full range) or A's token s - 1 - (i - fill) */
        for (int64_t i = 0; i < sb; ++i) {
            const int64_t src = i < fill ? 0 : s - 1 - (i - fill);
            memcpy((uint8_t *)b.tq.data + i * qrow, (uint8_t *)a.tq.data + src * qrow, (size_t)qrow);
            memcpy((float *)b.tw.data + i * h, (float *)a.tw.data + src * h, (size_t)h * sizeof(float));
            if (a.mx)
                memcpy((int32_t *)b.tqsf.data + i * h, (int32_t *)a.tqsf.data + src * h, (size_t)h * 4);
            ((int32_t *)b.tks.data)[i] = i < fill ? 0 : ((int32_t *)a.tks.data)[src] + (int32_t)off;
            ((int32_t *)b.tke.data)[i] = i < fill ? (int32_t)skb : ((int32_t *)a.tke.data)[src] + (int32_t)off;
        }
        for (int isa = DG_ISA_GENERIC; isa <= DG_ISA_AMX; ++isa) {
            if (dg_set_isa((dg_isa)isa) != DG_OK)
                continue;
            dg_tensor oa = tu_alloc2(DG_FLOAT32, s, sk), ob = tu_alloc2(DG_FLOAT32, sb, skb);
            TU_CHECK_OK(run(&a, 1, 0, &oa));
            TU_CHECK_OK(run(&b, 1, 0, &ob));
            int bad = 0;
            for (int64_t i = 0; i < s; ++i)
                for (int64_t j = ((int32_t *)a.tks.data)[i]; j < ((int32_t *)a.tke.data)[i]; ++j)
                    bad += memcmp((float *)oa.data + i * oa.strides[0] + j,
                                  (float *)ob.data + (fill + s - 1 - i) * ob.strides[0] + j + off, 4) != 0;
            TU_CHECK(bad == 0, "%s: S=%lld SK=%lld H=%lld D=%lld fmt=%d: %d logits change with the positions",
                     dg_isa_name((dg_isa)isa), (long long)s, (long long)sk, (long long)h, (long long)a.d,
                     cases[k].fmt, bad);
            tu_free(&oa), tu_free(&ob);
        }
        dg_set_isa(saved_isa);
        tu_free(&b.tq), tu_free(&b.tkv), tu_free(&b.tkvsf), tu_free(&b.tqsf), tu_free(&b.tw);
        tu_free(&b.tks), tu_free(&b.tke);
        free_case(&a);
    }
}

static void test_query_strides(void) {
    tu_rng rng = {1};
    mqa_case c;
    make_case(&c, &rng, 5, 100, 2, 32, 0, 0);
    random_ranges(&c, &rng);
    dg_tensor out = {0};
    out.dtype = DG_FLOAT32;
    TU_CHECK_OK(run(&c, 1, 0, &out));
    TU_CHECK(out.ndim == 2 && out.shape[0] == 5 && out.shape[1] == 100 && out.strides[0] == 512,
             "fp32 stride align(100 + 256, 256) = %lld", (long long)out.strides[0]);
    memset(&out, 0, sizeof out);
    out.dtype = DG_BFLOAT16;
    TU_CHECK_OK(run(&c, 0, 100, &out));
    TU_CHECK(out.shape[1] == 100 && out.strides[0] == 512 && out.dtype == DG_BFLOAT16, "bf16 compressed stride");
    memset(&out, 0, sizeof out);
    out.dtype = DG_BFLOAT16;
    TU_CHECK_OK(dg_fp8_mqa_logits(&c.tq, &c.tkv, &c.tkvsf, &c.tw, &c.tks, &c.tke, 1, 0, &out));
    TU_CHECK(out.dtype == DG_FLOAT32 && out.strides[0] == 512, "legacy query answers float32");
    /* The legacy entry computes the same bits as the FP8 path of the general one. */
    dg_tensor a = dg_tensor_2d(calloc(500, 4), DG_FLOAT32, 5, 100), b = a;
    b.data = calloc(500, 4);
    TU_CHECK_OK(dg_fp8_mqa_logits(&c.tq, &c.tkv, &c.tkvsf, &c.tw, &c.tks, &c.tke, 1, 0, &a));
    TU_CHECK_OK(run(&c, 1, 0, &b));
    TU_CHECK(memcmp(a.data, b.data, 2000) == 0, "legacy == general");
    free(a.data), free(b.data);
    free_case(&c);
}

/* A bad call returns `want`, names `arg` in the message and leaves the output untouched. */
#define EXPECT_BAD(call, want, arg)                                                                  \
    do {                                                                                             \
        memset(out.data, 0x33, bytes);                                                               \
        TU_CHECK_STATUS(call, want);                                                                 \
        TU_CHECK(strstr(dg_last_error(), arg) != NULL, "message names %s: %s", arg, dg_last_error()); \
        TU_CHECK(tu_unchanged(&out, snap), "output untouched after a bad %s", arg);                   \
    } while (0)

static void test_bad_inputs(void) {
    tu_rng rng = {2};
    mqa_case c, f, x;
    make_case(&c, &rng, 6, 40, 2, 32, 0, 0);
    make_case(&f, &rng, 6, 40, 2, 64, 1, 0);
    make_case(&x, &rng, 6, 40, 2, 64, 2, 0); /* MXFP8 */
    random_ranges(&c, &rng);
    random_ranges(&f, &rng);
    random_ranges(&x, &rng);
    dg_tensor out = tu_alloc2(DG_FLOAT32, 6, 40);
    const size_t bytes = dg_tensor_nbytes(&out);
    memset(out.data, 0x33, bytes);
    void *snap = tu_snapshot(&out);
    int32_t *ks = c.tks.data, *ke = c.tke.data;
    const int32_t ks0 = ks[2], ke0 = ke[2];

    EXPECT_BAD(dg_fp8_fp4_mqa_logits(NULL, NULL, &c.tkv, &c.tkvsf, &c.tw, &c.tks, &c.tke, 1, 0, &out),
               DG_ERR_NULL_POINTER, "'q'");
    dg_tensor t = c.tq;
    t.dtype = DG_BFLOAT16;
    EXPECT_BAD(dg_fp8_fp4_mqa_logits(&t, NULL, &c.tkv, &c.tkvsf, &c.tw, &c.tks, &c.tke, 1, 0, &out), DG_ERR_DTYPE, "'q'");
    t = dg_tensor_transpose(c.tq, 0, 1);
    EXPECT_BAD(dg_fp8_fp4_mqa_logits(&t, NULL, &c.tkv, &c.tkvsf, &c.tw, &c.tks, &c.tke, 1, 0, &out), DG_ERR_LAYOUT, "'q'");
    t = c.tkv;
    t.shape[1] = 16;
    EXPECT_BAD(run(&(mqa_case){.tq = c.tq, .tkv = t, .tkvsf = c.tkvsf, .tw = c.tw, .tks = c.tks, .tke = c.tke}, 1, 0, &out),
               DG_ERR_SHAPE, "'kv'");
    t = c.tkvsf;
    t.dtype = DG_INT32;
    EXPECT_BAD(dg_fp8_mqa_logits(&c.tq, &c.tkv, &t, &c.tw, &c.tks, &c.tke, 1, 0, &out), DG_ERR_DTYPE, "'kv_sf'");
    t = c.tkvsf;
    t.shape[0] = 39;
    EXPECT_BAD(dg_fp8_mqa_logits(&c.tq, &c.tkv, &t, &c.tw, &c.tks, &c.tke, 1, 0, &out), DG_ERR_SHAPE, "'kv_sf'");
    EXPECT_BAD(dg_fp8_mqa_logits(&c.tq, &f.tkv, &f.tkvsf, &c.tw, &c.tks, &c.tke, 1, 0, &out), DG_ERR_DTYPE, "'kv'");
    t = c.tw;
    t.shape[1] = 3;
    EXPECT_BAD(dg_fp8_mqa_logits(&c.tq, &c.tkv, &c.tkvsf, &t, &c.tks, &c.tke, 1, 0, &out), DG_ERR_SHAPE, "'weights'");
    dg_tensor wb = tu_alloc2(DG_BFLOAT16, 6, 2);
    EXPECT_BAD(dg_fp8_mqa_logits(&c.tq, &c.tkv, &c.tkvsf, &wb, &c.tks, &c.tke, 1, 0, &out), DG_ERR_DTYPE, "'weights'");
    t = c.tks;
    t.dtype = DG_INT64;
    EXPECT_BAD(dg_fp8_mqa_logits(&c.tq, &c.tkv, &c.tkvsf, &c.tw, &t, &c.tke, 1, 0, &out), DG_ERR_DTYPE,
               "'cu_seq_len_k_start'");
    t = c.tke;
    t.shape[0] = 5;
    EXPECT_BAD(dg_fp8_mqa_logits(&c.tq, &c.tkv, &c.tkvsf, &c.tw, &c.tks, &t, 1, 0, &out), DG_ERR_SHAPE,
               "'cu_seq_len_k_end'");
    ks[2] = 10, ke[2] = 9; /* ke < ks */
    EXPECT_BAD(dg_fp8_mqa_logits(&c.tq, &c.tkv, &c.tkvsf, &c.tw, &c.tks, &c.tke, 1, 0, &out), DG_ERR_VALUE,
               "'cu_seq_len_k_end'");
    ks[2] = 10, ke[2] = 41; /* past SK */
    EXPECT_BAD(dg_fp8_mqa_logits(&c.tq, &c.tkv, &c.tkvsf, &c.tw, &c.tks, &c.tke, 1, 0, &out), DG_ERR_VALUE,
               "'cu_seq_len_k_end'");
    ks[2] = -1, ke[2] = 3;
    EXPECT_BAD(dg_fp8_mqa_logits(&c.tq, &c.tkv, &c.tkvsf, &c.tw, &c.tks, &c.tke, 1, 0, &out), DG_ERR_VALUE,
               "'cu_seq_len_k_start'");
    ks[2] = 0, ke[2] = 40;
    dg_tensor small = tu_alloc2(DG_FLOAT32, 6, 39);
    EXPECT_BAD(dg_fp8_mqa_logits(&c.tq, &c.tkv, &c.tkvsf, &c.tw, &c.tks, &c.tke, 0, 39, &small), DG_ERR_VALUE,
               "'max_seqlen_k'");
    EXPECT_BAD(dg_fp8_mqa_logits(&c.tq, &c.tkv, &c.tkvsf, &c.tw, &c.tks, &c.tke, 0, -1, &out), DG_ERR_VALUE,
               "'max_seqlen_k'");
    ks[2] = ks0, ke[2] = ke0;
    /* Output problems. */
    EXPECT_BAD(dg_fp8_mqa_logits(&c.tq, &c.tkv, &c.tkvsf, &c.tw, &c.tks, &c.tke, 1, 0, NULL), DG_ERR_NULL_POINTER,
               "'logits'");
    EXPECT_BAD(dg_fp8_mqa_logits(&c.tq, &c.tkv, &c.tkvsf, &c.tw, &c.tks, &c.tke, 1, 0, &small), DG_ERR_SHAPE,
               "'logits'");
    t = out;
    t.dtype = DG_INT32;
    EXPECT_BAD(dg_fp8_fp4_mqa_logits(&c.tq, NULL, &c.tkv, &c.tkvsf, &c.tw, &c.tks, &c.tke, 1, 0, &t), DG_ERR_DTYPE,
               "'logits'");
    t = dg_tensor_2d(out.data, DG_BFLOAT16, 6, 40);
    EXPECT_BAD(dg_fp8_mqa_logits(&c.tq, &c.tkv, &c.tkvsf, &c.tw, &c.tks, &c.tke, 1, 0, &t), DG_ERR_DTYPE, "'logits'");
    t = dg_tensor_transpose(dg_tensor_2d(out.data, DG_FLOAT32, 40, 6), 0, 1);
    EXPECT_BAD(dg_fp8_mqa_logits(&c.tq, &c.tkv, &c.tkvsf, &c.tw, &c.tks, &c.tke, 1, 0, &t), DG_ERR_LAYOUT, "'logits'");
    t = out;
    t.strides[0] = 20; /* rows overlap */
    EXPECT_BAD(dg_fp8_mqa_logits(&c.tq, &c.tkv, &c.tkvsf, &c.tw, &c.tks, &c.tke, 1, 0, &t), DG_ERR_LAYOUT, "'logits'");
    dg_tensor kvf = dg_tensor_1d(out.data, DG_FLOAT32, 40); /* kv_sf aliases the output */
    memcpy(out.data, c.tkvsf.data, 160);
    void *snap2 = tu_snapshot(&out);
    TU_CHECK_STATUS(dg_fp8_mqa_logits(&c.tq, &c.tkv, &kvf, &c.tw, &c.tks, &c.tke, 1, 0, &out), DG_ERR_LAYOUT);
    TU_CHECK(strstr(dg_last_error(), "'kv_sf'") && tu_unchanged(&out, snap2), "aliasing: %s", dg_last_error());
    free(snap2);
    /* FP4 problems. */
    EXPECT_BAD(dg_fp8_mqa_logits(&f.tq, &f.tkv, &f.tkvsf, &f.tw, &f.tks, &f.tke, 1, 0, &out), DG_ERR_DTYPE, "'q'");
    t = f.tqsf;
    t.shape[1] = 1;
    EXPECT_BAD(dg_fp8_fp4_mqa_logits(&f.tq, &t, &f.tkv, &f.tkvsf, &f.tw, &f.tks, &f.tke, 1, 0, &out), DG_ERR_SHAPE,
               "'q_sf'");
    EXPECT_BAD(dg_fp8_fp4_mqa_logits(&f.tq, &f.tqsf, &f.tkv, &c.tkvsf, &f.tw, &f.tks, &f.tke, 1, 0, &out),
               DG_ERR_DTYPE, "'kv_sf'");
    t = dg_tensor_3d(f.tq.data, DG_FP4_E2M1X2, 6, 2, 24); /* D = 48 */
    EXPECT_BAD(dg_fp8_fp4_mqa_logits(&t, &f.tqsf, &f.tkv, &f.tkvsf, &f.tw, &f.tks, &f.tke, 1, 0, &out), DG_ERR_SHAPE,
               "'q'");
    TU_CHECK_OK(dg_fp8_fp4_mqa_logits(&f.tq, &f.tqsf, &f.tkv, &f.tkvsf, &f.tw, &f.tks, &f.tke, 1, 0, &out));
    /* MXFP8 problems: E4M3 q and kv with packed per-32 UE8M0 words; nothing written on failure. */
    memset(out.data, 0x33, bytes);
    EXPECT_BAD(dg_fp8_fp4_mqa_logits(&x.tq, &x.tqsf, &x.tkv, &c.tkvsf, &x.tw, &x.tks, &x.tke, 1, 0, &out),
               DG_ERR_DTYPE, "'kv_sf'"); /* float32 kv scales with MXFP8 q */
    EXPECT_BAD(dg_fp8_fp4_mqa_logits(&x.tq, &x.tqsf, &f.tkv, &x.tkvsf, &x.tw, &x.tks, &x.tke, 1, 0, &out),
               DG_ERR_DTYPE, "'kv'"); /* FP4 kv with MXFP8 q */
    EXPECT_BAD(dg_fp8_fp4_mqa_logits(&x.tq, NULL, &x.tkv, &x.tkvsf, &x.tw, &x.tks, &x.tke, 1, 0, &out),
               DG_ERR_DTYPE, "'kv_sf'"); /* no q_sf: plain FP8 wants float32 kv scales */
    t = dg_tensor_3d(x.tq.data, DG_FLOAT8_E4M3, 6, 2, 48); /* D = 48: not whole scale groups */
    EXPECT_BAD(dg_fp8_fp4_mqa_logits(&t, &x.tqsf, &x.tkv, &x.tkvsf, &x.tw, &x.tks, &x.tke, 1, 0, &out),
               DG_ERR_SHAPE, "'q'");
    t = dg_tensor_3d(x.tq.data, DG_BFLOAT16, 6, 2, 32);
    EXPECT_BAD(dg_fp8_fp4_mqa_logits(&t, &x.tqsf, &x.tkv, &x.tkvsf, &x.tw, &x.tks, &x.tke, 1, 0, &out),
               DG_ERR_DTYPE, "'q'");
    TU_CHECK(tu_unchanged(&out, snap), "MXFP8 failures leave the output untouched");
    TU_CHECK_OK(dg_fp8_fp4_mqa_logits(&x.tq, &x.tqsf, &x.tkv, &x.tkvsf, &x.tw, &x.tks, &x.tke, 1, 0, &out));
    free(snap);
    tu_free(&out), tu_free(&small), tu_free(&wb);
    free_case(&c), free_case(&f), free_case(&x);
}

/* FLOAT16 weights (DeepGEMM 2.8): bit for bit the logits of float32 weights of the same values,
 * for every format, both logits dtypes, the reference and every ISA level; rows padded as
 * upstream's test pads them (stride 16 for H = 12). */
static void test_f16_weights(void) {
    const dg_isa saved_isa = dg_get_isa();
    const dg_backend saved_backend = dg_get_backend();
    for (int fmt = 0; fmt < 3; ++fmt) {
        tu_rng rng = {fmt + 71};
        mqa_case c;
        make_case(&c, &rng, 19, 150, 12, 64, fmt, 0);
        random_ranges(&c, &rng);
        dg_tensor w16 = tu_f16_copy(c.tw.data, c.s, c.h, 16, 0.1f);
        const dg_tensor tw32 = c.tw;
        for (int be = 0; be < 2; ++be) {
            dg_set_backend(be ? DG_BACKEND_AUTO : DG_BACKEND_REFERENCE);
            for (int isa = be ? DG_ISA_GENERIC : DG_ISA_AMX; isa <= DG_ISA_AMX; ++isa) {
                if (be && dg_set_isa((dg_isa)isa) != DG_OK)
                    continue;
                for (int bf = 0; bf < 2; ++bf) {
                    const dg_dtype dt = bf ? DG_BFLOAT16 : DG_FLOAT32;
                    dg_tensor a = tu_alloc2(dt, c.s, c.sk), b = tu_alloc2(dt, c.s, c.sk);
                    c.tw = tw32;
                    TU_CHECK_OK(run(&c, 1, 0, &a));
                    c.tw = w16;
                    TU_CHECK_OK(run(&c, 1, 0, &b));
                    TU_CHECK(memcmp(a.data, b.data, dg_tensor_nbytes(&a)) == 0,
                             "float16 weights == float32 weights bitwise (fmt %d, %s logits, %s)", fmt,
                             dg_dtype_name(dt), be ? dg_isa_name(dg_get_isa()) : "reference");
                    tu_free(&a);
                    tu_free(&b);
                }
            }
            dg_set_isa(saved_isa);
        }
        c.tw = tw32;
        /* A float16 tensor of the wrong shape is refused like any other. */
        dg_tensor bad = w16, out = tu_alloc2(DG_FLOAT32, c.s, c.sk);
        const size_t bytes = dg_tensor_nbytes(&out);
        memset(out.data, 0x33, bytes);
        void *snap = tu_snapshot(&out);
        bad.shape[1] = c.h - 1;
        EXPECT_BAD(dg_fp8_fp4_mqa_logits(&c.tq, c.mx ? &c.tqsf : NULL, &c.tkv, &c.tkvsf, &bad, &c.tks, &c.tke, 1, 0,
                                         &out),
                   DG_ERR_SHAPE, "'weights'");
        free(snap);
        tu_free(&out);
        tu_free(&w16);
        free_case(&c);
    }
    dg_set_backend(saved_backend);
}

/* MXFP8 case c's kv and scales with one more row that no query sees, its group 0 scaled by
 * 2^-117: a scale byte out of the range of the tiles that flush denormals (VDPBF16PS, AMX), so
 * the call takes the exact FMA pair tile. */
static void add_unseen_row(const mqa_case *c, dg_tensor *kv, dg_tensor *sf) {
    *kv = tu_alloc2(DG_FLOAT8_E4M3, c->sk + 1, c->d);
    *sf = tu_alloc(DG_INT32, 1, (int64_t[]){c->sk + 1});
    memcpy(kv->data, c->tkv.data, (size_t)(c->sk * c->d));
    memset((uint8_t *)kv->data + c->sk * c->d, 0x38, (size_t)c->d);
    memcpy(sf->data, c->tkvsf.data, (size_t)c->sk * 4);
    ((uint32_t *)sf->data)[c->sk] = 0x7f7f7f0au;
}

/* The AVX-512 BF16 level's FP8 and MXFP8 tiles (kernels/avx512_bf16/mqa_fp8_pairs.c): VDPBF16PS
 * (AMD's default) and FMA in the same k-pair order (Intel's) give the same bits, on odd head
 * dims (the zero pair), heads not a multiple of 16, d past the tile's slice of 512, and
 * compressed rows; an MXFP8 call whose scales leave VDPBF16PS's range keeps every logit's bits. */
static void test_pair_tiles(void) {
    const dg_isa saved = dg_get_isa();
    if (dg_set_isa(DG_ISA_AVX512_BF16) != DG_OK)
        return; /* not on this CPU */
    static const struct { int64_t s, sk, h, d; int compressed, fmt; } cases[] = {
        {9, 130, 17, 1, 0, 0}, {7, 140, 3, 25, 1, 0}, {5, 100, 70, 128, 0, 0}, {4, 60, 16, 601, 1, 0},
        {3, 50, 33, 64, 0, 0}, {6, 90, 20, 128, 0, 2}, {5, 70, 3, 96, 1, 2}, {4, 40, 16, 32, 0, 2},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; ++k) {
        tu_rng rng = {k + 301};
        mqa_case c;
        make_case(&c, &rng, cases[k].s, cases[k].sk, cases[k].h, cases[k].d, cases[k].fmt, 0);
        random_ranges(&c, &rng);
        const int max_k = compressed_max_k(&c, cases[k].compressed);
        const int64_t width = max_k ? max_k : c.sk;
        dg_tensor out[2];
        TU_CHECK_OK(dg_set_isa(DG_ISA_AVX512_BF16));
        const int saved_paths = dg_get_print_paths();
        dg_set_print_paths(2);
        for (int v = 0; v < 2; ++v) {
            dg_engine_set_dpbf16(v);
            out[v] = tu_alloc2(DG_FLOAT32, c.s, width);
            tu_fill_bytes(&out[v], 0x5a);
            dg_clear_path_report();
            TU_CHECK_OK(run(&c, 1, max_k, &out[v]));
            char report[1024];
            dg_get_path_report(report, sizeof report);
            TU_CHECK(strstr(report, v ? "(VDPBF16PS)" : "(FMA, k pairs)") != NULL, "fmt %d, dpbf16 %d: took %s",
                     cases[k].fmt, v, report);
        }
        dg_engine_set_dpbf16(-1);
        TU_CHECK(memcmp(out[0].data, out[1].data, dg_tensor_nbytes(&out[0])) == 0,
                 "fmt %d at avx512_bf16: the FMA k-pair tile == the VDPBF16PS tile bitwise (S=%lld H=%lld D=%lld)",
                 cases[k].fmt, (long long)c.s, (long long)c.h, (long long)c.d);
        if (cases[k].fmt == 2) {
            /* One more kv row that no query sees, with a scale byte out of VDPBF16PS's range: the
             * call takes the FMA tile, and every logit keeps its bits. */
            dg_tensor kv, sf;
            add_unseen_row(&c, &kv, &sf);
            const int64_t w2 = max_k ? max_k : c.sk + 1;
            dg_tensor wide = tu_alloc2(DG_FLOAT32, c.s, w2);
            dg_engine_set_dpbf16(1);
            dg_clear_path_report();
            TU_CHECK_OK(dg_fp8_fp4_mqa_logits(&c.tq, &c.tqsf, &kv, &sf, &c.tw, &c.tks, &c.tke, 1, max_k, &wide));
            char report[1024];
            dg_get_path_report(report, sizeof report);
            TU_CHECK(strstr(report, "(FMA, k pairs)") != NULL, "MXFP8 out of range: took %s", report);
            dg_engine_set_dpbf16(-1);
            int64_t bad = 0;
            for (int64_t i = 0; i < c.s; ++i)
                bad += memcmp((const float *)wide.data + i * w2, (const float *)out[1].data + i * width,
                              (size_t)width * 4) != 0;
            TU_CHECK(bad == 0, "MXFP8: %lld rows changed bits when an unseen kv row's scale moved the call to the "
                     "FMA tile", (long long)bad);
            tu_free(&kv), tu_free(&sf), tu_free(&wide);
        }
        dg_tensor ref = tu_alloc2(DG_FLOAT32, c.s, width);
        const dg_backend be = dg_get_backend();
        dg_set_backend(DG_BACKEND_REFERENCE);
        TU_CHECK_OK(run(&c, 1, max_k, &ref));
        dg_set_backend(be);
        compare_outputs(&out[0], &ref, c.s, width, 5e-6, "FP8 / MXFP8 pair tiles vs reference");
        tu_free(&out[0]), tu_free(&out[1]), tu_free(&ref);
        free_case(&c);
        dg_clear_path_report();
        dg_set_print_paths(saved_paths);
        dg_set_isa(saved);
    }
}

/* The AMX tests' shapes: heads not a multiple of 16, every head dim, kv lengths that leave the
 * last panel partly filled, causal and random ranges, compressed rows, BF16 logits. */
typedef struct amx_case {
    int64_t s, sk, h, d;
    int causal, compressed, bf16;
} amx_case;
static const amx_case kAmxCases[] = {
    {9, 130, 17, 32, 0, 0, 0}, {7, 70, 1, 64, 1, 0, 1},     {20, 300, 70, 128, 0, 1, 0},
    {5, 17, 33, 96, 0, 0, 0},  {33, 800, 64, 128, 1, 0, 0}, {3, 200, 16, 64, 0, 1, 1},
};

/* Case a in format fmt (make_case) with its ranges, from seed. */
static void make_amx_case(mqa_case *c, const amx_case *a, int fmt, uint64_t seed) {
    tu_rng rng = {seed};
    make_case(c, &rng, a->s, a->sk, a->h, a->d, fmt, a->bf16);
    if (a->causal)
        causal_ranges(c);
    else
        random_ranges(c, &rng);
}

/* FP4 x FP4 at the AMX level (kernels/amx/mqa_fp4_amx.c: TDPBSSD group sums, then the VNNI
 * kernel's float steps) gives bitwise the AVX-512 BF16 level's logits (VPDPBUSD), on head counts
 * that are not multiples of 16, every head dim, kv lengths that leave the last panel partly
 * filled (the tile skips empty kv tiles), causal and random ranges, compressed rows and BF16
 * logits. Scale bytes span 1..254, so some groups' scales are float32 subnormals. */
static void test_fp4_amx_matches_vnni(void) {
    const dg_isa saved = dg_get_isa();
    if (dg_set_isa(DG_ISA_AMX) != DG_OK || dg_set_isa(DG_ISA_AVX512_BF16) != DG_OK) {
        dg_set_isa(saved);
        return; /* not on this CPU */
    }
    const amx_case *cases = kAmxCases;
    const int saved_paths = dg_get_print_paths();
    for (size_t k = 0; k < sizeof kAmxCases / sizeof kAmxCases[0]; ++k) {
        mqa_case c;
        make_amx_case(&c, &cases[k], 1, k + 1701);
        uint32_t *qsf = c.tqsf.data, *kvsf = c.tkvsf.data;
        for (int64_t i = 0; i < c.s * c.h; i += 5) /* odd scales: tiny, huge, mixed per group */
            qsf[i] = 0x01fe7f80u ^ (uint32_t)(i & 0x0f0f);
        for (int64_t i = 0; i < c.sk; i += 7)
            kvsf[i] = 0x7f02fd81u ^ (uint32_t)(i & 0x0f00);
        const int max_k = compressed_max_k(&c, cases[k].compressed);
        const int64_t width = max_k ? max_k : c.sk;
        const dg_dtype dt = cases[k].bf16 ? DG_BFLOAT16 : DG_FLOAT32;
        const dg_isa isas[2] = {DG_ISA_AVX512_BF16, DG_ISA_AMX};
        dg_tensor out[2];
        for (int v = 0; v < 2; ++v) {
            TU_CHECK_OK(dg_set_isa(isas[v]));
            out[v] = tu_alloc2(dt, c.s, width);
            tu_fill_bytes(&out[v], 0x5a);
            dg_set_print_paths(2);
            dg_clear_path_report();
            TU_CHECK_OK(run(&c, 1, max_k, &out[v]));
            char report[1024];
            dg_get_path_report(report, sizeof report);
            TU_CHECK(strstr(report, v ? "amx (int8)" : "avx512_vnni") != NULL, "FP4 at %s: took %s",
                     dg_isa_name(isas[v]), report);
        }
        TU_CHECK(memcmp(out[0].data, out[1].data, dg_tensor_nbytes(&out[0])) == 0,
                 "FP4 S=%lld SK=%lld H=%lld D=%lld: AMX tiles == VNNI bitwise", (long long)c.s, (long long)c.sk,
                 (long long)c.h, (long long)c.d);
        tu_free(&out[0]), tu_free(&out[1]);
        free_case(&c);
    }
    dg_clear_path_report();
    dg_set_print_paths(saved_paths);
    dg_set_isa(saved);
}

/* MXFP8 at the AMX level (kernels/amx/mqa_amx.c: each group's scale folded into the BF16
 * exponents, TDPBF16PS): against the reference on scale bytes far from a quantizer's (every
 * delta from -47 to +48, mixed per group and row, still inside the normal range), odd head
 * counts, every head dim, causal and random ranges, compressed rows and BF16 logits. A call
 * with one scale byte out of that range (a kv row no query sees) takes the AVX-512 BF16 level's
 * FMA pair tile, bitwise that level's logits; the in-range logits then change bits (the one
 * place where a logit depends on the rest of its call at this level; see mqa_kernels.h). */
static void test_mxfp8_amx(void) {
    const dg_isa saved = dg_get_isa();
    if (dg_set_isa(DG_ISA_AMX) != DG_OK || dg_set_isa(DG_ISA_AVX512_BF16) != DG_OK) {
        dg_set_isa(saved);
        return; /* not on this CPU */
    }
    const amx_case *cases = kAmxCases;
    const int saved_paths = dg_get_print_paths();
    dg_set_print_paths(2);
    for (size_t k = 0; k < sizeof kAmxCases / sizeof kAmxCases[0]; ++k) {
        mqa_case c;
        make_amx_case(&c, &cases[k], 2, k + 1901);
        uint32_t *qsf = c.tqsf.data, *kvsf = c.tkvsf.data;
        for (int64_t i = 0; i < c.s * c.h; i += 3) /* q bytes 80..175, kv 96..175: in range */
            qsf[i] = 0x5060a070u ^ (uint32_t)(i & 0x0f0f0f0f);
        for (int64_t i = 1; i < c.sk; i += 4)
            kvsf[i] = 0x907060a0u ^ (uint32_t)(i & 0x0f0f0f0f);
        const int max_k = compressed_max_k(&c, cases[k].compressed);
        const int64_t width = max_k ? max_k : c.sk;
        const dg_dtype dt = cases[k].bf16 ? DG_BFLOAT16 : DG_FLOAT32;
        char tag[128];
        snprintf(tag, sizeof tag, "MXFP8 at amx: S=%lld SK=%lld H=%lld D=%lld causal=%d max_k=%d", (long long)c.s,
                 (long long)c.sk, (long long)c.h, (long long)c.d, cases[k].causal, max_k);
        dg_tensor ref = tu_alloc2(dt, c.s, width), out = tu_alloc2(dt, c.s, width);
        const dg_backend be = dg_get_backend();
        dg_set_backend(DG_BACKEND_REFERENCE);
        TU_CHECK_OK(run(&c, 1, max_k, &ref));
        dg_set_backend(DG_BACKEND_AUTO);
        TU_CHECK_OK(dg_set_isa(DG_ISA_AMX));
        tu_fill_bytes(&out, 0x5a);
        dg_clear_path_report();
        TU_CHECK_OK(run(&c, 1, max_k, &out));
        char report[1024];
        dg_get_path_report(report, sizeof report);
        TU_CHECK(strstr(report, "amx kernel (MXFP8") != NULL, "%s: took %s", tag, report);
        compare_outputs(&out, &ref, c.s, width, cases[k].bf16 ? 3e-5 : 5e-6, tag);

        dg_tensor kv, sf; /* the call leaves TDPBF16PS's range */
        add_unseen_row(&c, &kv, &sf);
        const int64_t w2 = max_k ? max_k : c.sk + 1;
        dg_tensor wide[2];
        const dg_isa isas[2] = {DG_ISA_AMX, DG_ISA_AVX512_BF16};
        for (int v = 0; v < 2; ++v) {
            TU_CHECK_OK(dg_set_isa(isas[v]));
            wide[v] = tu_alloc2(dt, c.s, w2);
            dg_clear_path_report();
            TU_CHECK_OK(dg_fp8_fp4_mqa_logits(&c.tq, &c.tqsf, &kv, &sf, &c.tw, &c.tks, &c.tke, 1, max_k, &wide[v]));
            dg_get_path_report(report, sizeof report);
            TU_CHECK(v || strstr(report, "(FMA, k pairs)") != NULL, "%s, out of range: took %s", tag, report);
        }
        TU_CHECK(memcmp(wide[0].data, wide[1].data, dg_tensor_nbytes(&wide[0])) == 0,
                 "%s, out of range: the AVX-512 BF16 level's logits bitwise", tag);
        compare_outputs(&wide[0], &ref, c.s, width, cases[k].bf16 ? 3e-5 : 5e-6, tag);
        tu_free(&kv), tu_free(&sf), tu_free(&wide[0]), tu_free(&wide[1]);
        tu_free(&ref), tu_free(&out);
        free_case(&c);
        dg_set_backend(be);
    }
    dg_clear_path_report();
    dg_set_print_paths(saved_paths);
    dg_set_isa(saved);
}

int main(void) {
    static const struct { int64_t s, sk, h, d; int fmt, bf16; dg_dtype out; } cases[] = {
        {24, 100, 4, 32, 0, 0, DG_FLOAT32},  {17, 130, 8, 64, 0, 0, DG_FLOAT32},
        {9, 70, 2, 128, 0, 0, DG_FLOAT32},   {12, 64, 4, 64, 0, 1, DG_BFLOAT16},
        {10, 50, 3, 32, 0, 0, DG_BFLOAT16},  {11, 90, 4, 64, 1, 0, DG_FLOAT32},
        {8, 77, 2, 128, 1, 1, DG_BFLOAT16},  {1, 1, 1, 32, 0, 0, DG_FLOAT32},
        {6, 33, 2, 32, 1, 0, DG_FLOAT32},    {11, 90, 4, 64, 2, 0, DG_FLOAT32},
        {8, 77, 2, 128, 2, 1, DG_BFLOAT16},  {6, 33, 3, 32, 2, 0, DG_FLOAT32},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; ++k) {
        tu_rng rng = {k + 11};
        mqa_case c;
        make_case(&c, &rng, cases[k].s, cases[k].sk, cases[k].h, cases[k].d, cases[k].fmt, cases[k].bf16);
        random_ranges(&c, &rng);
        char tag[96];
        snprintf(tag, sizeof tag, "S=%lld SK=%lld H=%lld D=%lld fmt=%d bf16w=%d out=%s", (long long)c.s,
                 (long long)c.sk, (long long)c.h, (long long)c.d, cases[k].fmt, c.bf16_weights,
                 dg_dtype_name(cases[k].out));
        check_case(&c, cases[k].out, tag);
        free_case(&c);
    }
    check_accuracy(0, 0);
    check_accuracy(0, 1);
    check_accuracy(1, 0);
    check_accuracy(1, 1);
    check_accuracy(2, 0);
    check_accuracy(2, 1);
    test_query_strides();
    test_bad_inputs();
    test_fast_vs_reference();
    test_position_invariance();
    test_f16_weights();
    test_pair_tiles();
    test_fp4_amx_matches_vnni();
    test_mxfp8_amx();
    return tu_finish();
}
