/*
 * operand.h - a GEMM operand as DeepGEMM passes it: a data view of logical shape [MN, K]
 * (or [G, MN, K]) in BF16, FP32, E4M3 or packed E2M1, with optional block scales in any of
 * DeepGEMM's scale layouts (float32 of any strides, including MN-major TMA-aligned views, or
 * int32-packed UE8M0). Reference kernels read elements through it; fast kernels use it only
 * for argument checking and read the memory themselves.
 *
 * Logical element (g, i, kk) = raw(g, i, kk) * scale(g, i, kk) where
 *   scale = sf[g, i / gran_mn, kk / gran_k]                       (float32 sf)
 *         = 2^(byte (kk/gran_k) % 4 of sf[g, i / gran_mn, (kk/gran_k) / 4] - 127)  (packed)
 */
#ifndef DG_CORE_OPERAND_H
#define DG_CORE_OPERAND_H

#include "internal.h"

typedef struct dg_operand {
    const dg_tensor *data;
    const dg_tensor *sf;   /* NULL: no scales (BF16 / FP32 data) */
    int grouped;           /* data (and sf) have a leading group dimension */
    int64_t groups, mn, k; /* logical extents; groups = 1 when not grouped */
    int fp4_dim;           /* -1, or the data dimension along which FP4 pairs run */
    int gran_mn, gran_k;
    int sf_packed;         /* sf is INT32 holding four UE8M0 bytes */
    /* Float32 sf only: 0 not yet known; 1 every scale is a power of two (or, on the engine's
     * own copies, assumed to be while a kernel checks them: dg_engine_gemm_assuming_pow2), -1
     * not every one. Set by the engine after its one scan (dg_engine_plan_scales) of a grouped
     * call's B group and inherited by that group's row views, so that a large scale tensor
     * (FP4's 1 x 32 float scales: a quarter of the weight bytes) is read once per call. */
    int sf_pow2;
} dg_operand;

/*
 * Checks `data` (2-D, or 3-D when grouped) against the dtypes in `allowed` and computes the
 * logical extents. For packed FP4 the unit-stride dimension holds the pairs and its logical
 * extent is doubled (DeepGEMM's rule). Scales are attached later by dg_operand_set_scales.
 */
dg_status dg_operand_init(dg_operand *op, const char *name, const dg_tensor *data, int grouped,
                          const dg_dtype *allowed, int n_allowed);

/*
 * Attaches scales with granularity (gran_mn, gran_k) and checks them the way DeepGEMM does:
 * FLOAT32 sf of shape [(G,) ceil(MN/gran_mn), ceil(K/gran_k)] or INT32 packed UE8M0 of shape
 * [(G,) ceil(MN/gran_mn), ceil(K/(4*gran_k))] (packed requires gran_mn == 1), any strides.
 * A NULL sf is only accepted for BF16/FP32 data.
 */
dg_status dg_operand_set_scales(dg_operand *op, const char *sf_name, const dg_tensor *sf,
                                int gran_mn, int gran_k);

/* opts' alpha (DeepGEMM 2.8), if given: finite; with `allowed` false (every GEMM but the dense
 * ones) a given alpha is DG_ERR_UNSUPPORTED. */
dg_status dg_check_alpha(const dg_gemm_options *opts, bool allowed);

/*
 * Resolves DeepGEMM's recipe arguments into (gran_mn, gran_k) per operand. With neither
 * `recipe` nor `recipe_a/_b` given, the default follows the scale dtype of B: float32 ->
 * (1, 128, 128), packed int32 -> (1, 1, 128).
 */
dg_status dg_resolve_recipe(const dg_gemm_options *opt, const dg_tensor *sfa, const dg_tensor *sfb,
                            int gran_a[2], int gran_b[2]);

/* Unscaled element (g, i, kk) of the logical [G, MN, K] operand. */
static inline float dg_operand_raw(const dg_operand *op, int64_t g, int64_t i, int64_t kk) {
    const dg_tensor *t = op->data;
    const int b = op->grouped ? 1 : 0;
    int64_t off = op->grouped ? g * t->strides[0] : 0;
    if (op->fp4_dim < 0) {
        off += i * t->strides[b] + kk * t->strides[b + 1];
        const char *p = (const char *)t->data + off * (int64_t)dg_dtype_size(t->dtype);
        return dg_load_float(t, p);
    }
    const int64_t packed_idx = (op->fp4_dim == b + 1) ? kk : i;
    const int64_t ii = (op->fp4_dim == b) ? i / 2 : i;
    const int64_t kj = (op->fp4_dim == b + 1) ? kk / 2 : kk;
    off += ii * t->strides[b] + kj * t->strides[b + 1];
    const uint8_t byte = ((const uint8_t *)t->data)[off];
    return dg_e2m1_to_float((packed_idx & 1) ? (uint8_t)(byte >> 4) : (uint8_t)(byte & 15));
}

/* Scale of element (g, i, kk); 1 when the operand has no scales. */
static inline float dg_operand_scale(const dg_operand *op, int64_t g, int64_t i, int64_t kk) {
    const dg_tensor *s = op->sf;
    if (!s)
        return 1.0f;
    const int b = op->grouped ? 1 : 0;
    const int64_t si = i / op->gran_mn, sk = kk / op->gran_k;
    int64_t off = op->grouped ? g * s->strides[0] : 0;
    if (!op->sf_packed) {
        off += si * s->strides[b] + sk * s->strides[b + 1];
        return ((const float *)s->data)[off];
    }
    off += si * s->strides[b] + (sk / 4) * s->strides[b + 1];
    const uint32_t word = ((const uint32_t *)s->data)[off];
    return dg_ue8m0_to_float((uint8_t)(word >> (8 * (sk % 4))));
}

/*
 * out[q * ostride] = mult * scale(0, i, q * step) for the q < count with q * step < K, and 1
 * past K: a row of dg_operand_scale at a block step, for the kernels' per-row scale tables.
 * When step divides gran_k or gran_k divides step (every engine block plan), the row is
 * located once and walked without divisions; per element, dg_operand_scale's index divisions
 * cost more than an FP4 block's kernel work. Other steps take dg_operand_scale per element.
 */
void dg_operand_scale_row(const dg_operand *op, int64_t i, int64_t step, int64_t count, float mult, float *out,
                          int64_t ostride);
/* out[q * ostride] = scale(0, i, (q0 + q) * gran_k) for q < count: the scales of row i's K blocks
 * q0 .. q0 + count - 1 (all inside K), the row located once (the operand has scales). */
void dg_operand_block_scales(const dg_operand *op, int64_t i, int64_t q0, int64_t count, float *out, int64_t ostride);
/* The same for rows i0 .. i0 + rows - 1 into out[q * ostride + r] (no call per element; MN-major
 * packed scales, DeepGEMM's layout for weights, read block by block). */
void dg_operand_block_scales_rows(const dg_operand *op, int64_t i0, int rows, int64_t q0, int64_t count, float *out,
                                  int64_t ostride);
/* Prefetches the scale lines dg_operand_block_scales_rows(op, i0, rows, 0, count) reads (K-major
 * scales: a row's blocks; a decode call's scales would otherwise be demand misses). */
void dg_operand_prefetch_scales(const dg_operand *op, int64_t i0, int rows, int64_t count);

static inline float dg_operand_get(const dg_operand *op, int64_t g, int64_t i, int64_t kk) {
    return dg_operand_raw(op, g, i, kk) * dg_operand_scale(op, g, i, kk);
}

#endif /* DG_CORE_OPERAND_H */
