/*
 * pack.c - packing GEMM operands into the engine's panels (format: engine.h) and choosing how
 * scales are applied. Every source layout goes through one step: a logical row [K] of the
 * operand is widened to BF16 bits (exact for BF16, E4M3 and E2M1; power-of-two scales folded
 * in), then scattered into its panel. Cost O(MN * K), against O(M * N * K) for the product.
 */
#include "engine.h"

#include <pthread.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

/* ---- exact widening tables ---------------------------------------------------------------- */

static uint16_t g_e4m3_bf16[256], g_e2m1_bf16[16];
static pthread_once_t g_tables_once = PTHREAD_ONCE_INIT;

static void init_tables(void) {
    for (int i = 0; i < 256; ++i) /* NaN codes stay NaN; every other value is exact in BF16 */
        g_e4m3_bf16[i] = dg_float_to_bf16(dg_e4m3_to_float((uint8_t)i));
    for (int i = 0; i < 16; ++i)
        g_e2m1_bf16[i] = dg_float_to_bf16(dg_e2m1_to_float((uint8_t)i));
}

/* ---- scale plan ------------------------------------------------------------------------ */

/* Every float32 scale of the operand is a positive power of two (UE8M0-valued). The row-major
 * scan is branch-free (it vectorises) and split over the threads when large: it reads every
 * scale before the GEMM starts (FP4 weights with 1 x 32 float scales: a quarter of the weight
 * bytes), and one thread scanning alone had kept the other idle for 6% of an M = 1 call. */
static bool all_scales_pow2(const dg_operand *op) {
    const dg_tensor *t = op->sf;
    if (dg_tensor_numel(t) == 0) /* none (K = 0 or MN = 0): the data pointer may be NULL */
        return true;
    if (!op->grouped && t->strides[1] == 1) { /* row-major float32: scan the rows directly */
        const int64_t rows = t->shape[0], cols = t->shape[1];
        uint32_t bad = 0;
#pragma omp parallel for reduction(| : bad) schedule(static) num_threads(dg_num_threads()) if (rows * cols >= (1 << 18))
        for (int64_t r = 0; r < rows; ++r) {
            const float *row = (const float *)t->data + r * t->strides[0];
            uint32_t b = 0;
            for (int64_t q = 0; q < cols; ++q) { /* sign and mantissa zero, exponent field 1 .. 254 */
                uint32_t u;
                memcpy(&u, row + q, 4);
                b |= (u & 0x807fffffu) | (uint32_t)(u - 0x00800000u >= 0x7f000000u);
            }
            bad |= b;
        }
        return bad == 0;
    }
    for (int64_t i = 0; i < op->mn; i += op->gran_mn)
        for (int64_t kk = 0; kk < op->k; kk += op->gran_k)
            if (!dg_engine_scale_pow2(dg_operand_scale(op, 0, i, kk)))
                return false;
    return true;
}

static int gcd(int a, int b) { return b ? gcd(b, a % b) : a; }

/*
 * A's float32 scales are never folded: deciding from all of A's values would make one row's
 * result depend on other rows (batch invariance). B (the weight) may be scanned: a row of D
 * always depends on all of B anyway.
 */
bool dg_engine_plan_scales(const dg_operand *a, const dg_operand *b, dg_scale_plan *plan) {
    if (a->grouped || b->grouped)
        return false;
    plan->fold_a = !a->sf || a->sf_packed;
    plan->fold_b = !b->sf || b->sf_packed || (b->sf_pow2 ? b->sf_pow2 > 0 : all_scales_pow2(b));
    plan->gblk = dg_engine_k_block(plan->fold_a ? 0 : a->gran_k, plan->fold_b ? 0 : b->gran_k, b->k);
    return plan->gblk % 2 == 0; /* K blocks must hold whole k pairs */
}

int dg_engine_k_block(int gran_a, int gran_b, int64_t k) {
    int blk = DG_ACC_BLOCK;
    if (gran_a > 0 && gran_a < k) /* a scale block covering all of K constrains nothing */
        blk = gcd(blk, gran_a);
    if (gran_b > 0 && gran_b < k)
        blk = gcd(blk, gran_b);
    return blk;
}

/* ---- one logical row as BF16 ----------------------------------------------------------- */

/* out[0 .. k1 - k0) = row i of op (group 0), k in [k0, k1), as BF16 bits with the folded
 * scales applied; zero for k >= K. */
/* SIMD widening of a K-contiguous FP8 / FP4 row range, one call per scale block. */
static bool fetch_simd(const dg_operand *op, int64_t i, int fold, int64_t k0, int64_t ke, uint16_t *out,
                       const dg_engine_cfg *isa) {
    const dg_tensor *t = op->data;
    const bool e4m3 = t->dtype == DG_FLOAT8_E4M3;
    if (!isa || !isa->widen_e4m3 || t->strides[1] != 1 || !(e4m3 || (op->fp4_dim == 1 && k0 % 2 == 0)))
        return false;
    const bool scaled = fold && op->sf;
    if (scaled && op->gran_k % 2)
        return false;
    const uint8_t *p = (const uint8_t *)t->data + i * t->strides[0];
    if (scaled && !e4m3 && isa->widen_e2m1_blocks) { /* FP4's short scale blocks: up to 64 per call */
        float sc[64];
        const int64_t g = op->gran_k;
        for (int64_t kb = k0, q0 = k0 / g; kb < ke;) { /* one division: they cost as much as a block's widening */
            int64_t nq = 0, end = q0 * g;
            while (end < ke && nq < 64)
                end += g, ++nq;
            end = end < ke ? end : ke;
            dg_operand_block_scales(op, i, q0, nq, sc, 1);
            isa->widen_e2m1_blocks(p + kb / 2, end - kb, kb - q0 * g, g, sc, out + kb);
            kb = end, q0 += nq;
        }
        return true;
    }
    for (int64_t kb = k0; kb < ke;) {
        int64_t next = ke;
        float s = 1.0f;
        if (scaled) {
            next = (kb / op->gran_k + 1) * op->gran_k;
            next = next < ke ? next : ke;
            s = dg_operand_scale(op, 0, i, kb);
        }
        if (e4m3)
            isa->widen_e4m3(p + kb, next - kb, s, out + kb);
        else
            isa->widen_e2m1(p + kb / 2, next - kb, s, out + kb);
        kb = next;
    }
    return true;
}

void dg_engine_fetch_bf16(const dg_operand *op, int64_t i, int fold, int64_t k0, int64_t k1, uint16_t *out,
                          const dg_engine_cfg *isa) {
    pthread_once(&g_tables_once, init_tables);
    const dg_tensor *t = op->data;
    const int64_t s0 = t->strides[0], s1 = t->strides[1], ke = k1 < op->k ? k1 : op->k;
    if (ke <= k0) { /* nothing to read: a K = 0 operand may have NULL data and any row stride */
        memset(out, 0, (size_t)(k1 > k0 ? k1 - k0 : 0) * sizeof *out);
        return;
    }
    out -= k0; /* index by kk */
    if (ke > k0 && fetch_simd(op, i, fold, k0, ke, out, isa)) {
        for (int64_t kk = ke; kk < k1; ++kk)
            out[kk] = 0;
        return;
    }
    if (op->fp4_dim == 1 && fold && op->sf && s1 == 1) { /* FP4 along K, scales folded per chunk */
        const uint8_t *p = (const uint8_t *)t->data + i * s0;
        for (int64_t kb = k0 - k0 % op->gran_k; kb < ke; kb += op->gran_k) {
            const float sc = dg_operand_scale(op, 0, i, kb);
            uint16_t lut[16];
            for (int c = 0; c < 16; ++c)
                lut[c] = dg_engine_f32_bf16(dg_engine_bf16_f32(g_e2m1_bf16[c]) * sc);
            const int64_t lo = kb > k0 ? kb : k0, hi = kb + op->gran_k < ke ? kb + op->gran_k : ke;
            for (int64_t kk = lo; kk < hi; ++kk)
                out[kk] = lut[(p[kk >> 1] >> (4 * (kk & 1))) & 15];
        }
        for (int64_t kk = ke > k0 ? ke : k0; kk < k1; ++kk)
            out[kk] = 0;
        return;
    }
    if (t->dtype == DG_BFLOAT16) {
        const uint16_t *p = (const uint16_t *)t->data + i * s0;
        if (s1 == 1 && ke > k0)
            memcpy(out + k0, p + k0, (size_t)(ke - k0) * 2);
        else
            for (int64_t kk = k0; kk < ke; ++kk)
                out[kk] = p[kk * s1];
    } else if (t->dtype == DG_FLOAT8_E4M3) {
        const uint8_t *p = (const uint8_t *)t->data + i * s0;
        for (int64_t kk = k0; kk < ke; ++kk)
            out[kk] = g_e4m3_bf16[p[kk * s1]];
    } else if (op->fp4_dim == 1) { /* nibble pairs along K (low nibble first) */
        const uint8_t *p = (const uint8_t *)t->data + i * s0;
        int64_t kk = k0;
        if (kk < ke && (kk & 1))
            out[kk] = g_e2m1_bf16[p[(kk / 2) * s1] >> 4], ++kk;
        for (; kk + 1 < ke; kk += 2) {
            const uint8_t byte = p[(kk / 2) * s1];
            out[kk] = g_e2m1_bf16[byte & 15];
            out[kk + 1] = g_e2m1_bf16[byte >> 4];
        }
        if (kk < ke)
            out[kk] = g_e2m1_bf16[p[(kk / 2) * s1] & 15];
    } else { /* nibble pairs along MN */
        const uint8_t *p = (const uint8_t *)t->data + (i / 2) * s0;
        const int sh = 4 * (int)(i & 1);
        for (int64_t kk = k0; kk < ke; ++kk)
            out[kk] = g_e2m1_bf16[(p[kk * s1] >> sh) & 15];
    }
    for (int64_t kk = ke > k0 ? ke : k0; kk < k1; ++kk)
        out[kk] = 0;
    if (!fold || !op->sf)
        return;
    for (int64_t kb = k0 - k0 % op->gran_k; kb < ke; kb += op->gran_k) { /* x * 2^e: exact in BF16 */
        const float s = dg_operand_scale(op, 0, i, kb);
        const int64_t lo = kb > k0 ? kb : k0, hi = kb + op->gran_k < ke ? kb + op->gran_k : ke;
        for (int64_t kk = lo; kk < hi; ++kk)
            out[kk] = dg_engine_f32_bf16(dg_engine_bf16_f32(out[kk]) * s);
    }
}

static void fetch_row(const dg_operand *op, int64_t i, int fold, int64_t kp, uint16_t *out,
                      const dg_engine_cfg *isa) {
    dg_engine_fetch_bf16(op, i, fold, 0, kp, out, isa);
}

/* ---- panels ------------------------------------------------------------------------------ */

/* The ISA packer reads the operand directly: BF16, unit stride along K, nothing to fold. */
static bool direct_bf16(const dg_operand *op, int fold) {
    return op->data->dtype == DG_BFLOAT16 && op->data->strides[1] == 1 && !(fold && op->sf);
}

/* A one-row panel (r = 1: the small-M path's A at M = 1) from BF16 row values [0, valid),
 * zero up to kp: the row widened (F32) or copied (BF16 pairs: word q is k 2q, 2q + 1). The ISA
 * packers' transposes spent their work on padding rows here (AVX2, K 7168: about 50 us a call
 * on Zen 4, half of a decoding call's time with B in L2). */
static void pack_one_row(const uint16_t *row, int64_t valid, int64_t kp, dg_pack_fmt fmt, void *dst) {
    if (fmt != DG_PACK_F32) {
        memcpy(dst, row, (size_t)valid * 2);
        memset((uint16_t *)dst + valid, 0, (size_t)(kp - valid) * 2);
        return;
    }
    uint32_t *d = (uint32_t *)dst; /* float32 bits */
    for (int64_t kk = 0; kk < valid; ++kk)
        d[kk] = (uint32_t)row[kk] << 16;
    memset(d + valid, 0, (size_t)(kp - valid) * 4);
}

/* Unfolded scales of panel p: S[kb][r]. */
static void pack_scales(const dg_operand *op, const dg_packed *pk, int64_t p) {
    for (int rr = 0; rr < pk->r; ++rr) {
        const int64_t i = p * pk->r + rr;
        for (int64_t kb = 0; kb < pk->nkb; ++kb)
            pk->scales[(p * pk->nkb + kb) * pk->r + rr] = i < op->mn ? dg_operand_scale(op, 0, i, kb * pk->gblk) : 1.0f;
    }
}

/* Portable scatter of one BF16 row into its panel. */
static void scatter_row(const dg_packed *pk, int64_t p, int rr, const uint16_t *row) {
    const int r = pk->r;
    const int64_t kp = pk->kp;
    if (pk->fmt == DG_PACK_AMX_A) { /* 32-element pieces of the row, one per k step */
        uint16_t *dst = (uint16_t *)pk->data + p * kp * r + 32 * rr;
        for (int64_t k0 = 0; k0 < kp; k0 += 32)
            memcpy(dst + k0 * r, row + k0, 64);
    } else if (pk->fmt == DG_PACK_F32) {
        float *dst = (float *)pk->data + p * kp * r + rr;
        for (int64_t kk = 0; kk < kp; ++kk)
            dst[kk * r] = dg_engine_bf16_f32(row[kk]);
    } else {
        uint32_t *dst = (uint32_t *)pk->data + p * (kp / 2) * r + rr;
        for (int64_t q = 0; q < kp / 2; ++q)
            dst[q * r] = (uint32_t)row[2 * q] | (uint32_t)row[2 * q + 1] << 16;
    }
}

/* An MN-major BF16 operand (element (i, k) at i + k * ld) into DG_PACK_AMX_A panel p: per k
 * step a 32 x R block transposed through L1 (the source lines of one step stay in L1, where
 * widening whole rows would walk K with a stride of ld for every row). */
static void pack_amx_a_mn(const dg_operand *op, const dg_packed *pk, int64_t p, int64_t rows, uint16_t *dst,
                          const dg_engine_cfg *isa) {
    const int r = pk->r;
    const int64_t ld = op->data->strides[1], k = op->k, i0 = p * r;
    const uint16_t *base = (const uint16_t *)op->data->data + i0;
    for (int64_t k0 = 0; k0 < pk->kp; k0 += 32) {
        uint16_t *blk = dst + k0 * r;
        if (isa && isa->pack_amx_a_mn && (r == 16 || r == 32)) {
            isa->pack_amx_a_mn(base, ld, rows, r, k0, k, blk);
            continue;
        }
        const int kn = (int)(k - k0 < 0 ? 0 : k - k0 < 32 ? k - k0 : 32);
        for (int rr = 0; rr < r; ++rr) {
            uint16_t *o = blk + 32 * rr;
            if (rr < rows)
                for (int kk = 0; kk < kn; ++kk)
                    o[kk] = base[rr + (k0 + kk) * ld];
            for (int kk = rr < rows ? kn : 0; kk < 32; ++kk)
                o[kk] = 0;
        }
    }
}

/*
 * Panel p. With an ISA packer (fn) the rows are either read in place (BF16, K-major) or first
 * widened into a K-major BF16 staging block `stage` [r][kp] (any dtype/layout, folded scales),
 * then transposed by fn; without one, each widened row is scattered by portable code.
 */
static void pack_panel(const dg_operand *op, int fold, const dg_packed *pk, int64_t p, uint16_t *stage,
                       dg_pack_bf16_fn fn, dg_pack_bf16_fn fn_mn, const dg_engine_cfg *isa) {
    const int r = pk->r;
    const int64_t kp = pk->kp, i0 = p * r, rows = op->mn - i0 < r ? op->mn - i0 : r;
    const size_t es = pk->fmt == DG_PACK_F32 ? 4 : 2;
    void *dst = (char *)pk->data + (size_t)(p * kp * r) * es;
    if (pk->scales)
        pack_scales(op, pk, p);
    if (pk->fmt == DG_PACK_AMX_A) { /* row pieces: no transpose, so no ISA packer */
        if (op->data->dtype == DG_BFLOAT16 && op->data->strides[0] == 1 && !(fold && op->sf)) {
            pack_amx_a_mn(op, pk, p, rows, dst, isa);
            return;
        }
        for (int rr = 0; rr < r; ++rr) {
            if (rr < rows && direct_bf16(op, fold) && op->k == kp) {
                scatter_row(pk, p, rr, (const uint16_t *)op->data->data + (i0 + rr) * op->data->strides[0]);
                continue;
            }
            if (rr < rows)
                fetch_row(op, i0 + rr, fold, kp, stage, isa);
            else
                memset(stage, 0, (size_t)kp * 2);
            scatter_row(pk, p, rr, stage);
        }
        return;
    }
    if (r == 1) { /* F32 or BF16 pairs: the panel is the row itself (pack_one_row) */
        if (direct_bf16(op, fold)) {
            pack_one_row((const uint16_t *)op->data->data + i0 * op->data->strides[0], op->k, kp, pk->fmt, dst);
        } else {
            fetch_row(op, i0, fold, kp, stage, isa);
            pack_one_row(stage, kp, kp, pk->fmt, dst);
        }
        return;
    }
    if (fn && direct_bf16(op, fold)) {
        const int64_t ld = op->data->strides[0];
        fn((const uint16_t *)op->data->data + i0 * ld, ld, rows, r, 0, kp, op->k, pk->fmt, dst);
        return;
    }
    if (fn_mn && op->data->dtype == DG_BFLOAT16 && op->data->strides[0] == 1 && !(fold && op->sf)) {
        fn_mn((const uint16_t *)op->data->data + i0, op->data->strides[1], rows, r, 0, kp, op->k, pk->fmt, dst);
        return;
    }
    for (int rr = 0; rr < r; ++rr) {
        uint16_t *row = fn ? stage + rr * kp : stage;
        if (rr < rows)
            fetch_row(op, i0 + rr, fold, kp, row, isa);
        else
            memset(row, 0, (size_t)kp * 2);
        if (!fn)
            scatter_row(pk, p, rr, row);
    }
    if (fn)
        fn(stage, kp, r, r, 0, kp, kp, pk->fmt, dst);
}

dg_status dg_engine_pack(const dg_operand *op, int fold, int gblk, dg_pack_fmt fmt, int r,
                         const dg_engine_cfg *isa, dg_packed *out) {
    pthread_once(&g_tables_once, init_tables);
    memset(out, 0, sizeof *out);
    out->fmt = fmt, out->r = r, out->mn = op->mn, out->k = op->k;
    out->kp = dg_pack_kp(fmt, op->k);
    out->panels = dg_ceil_div(op->mn, r);
    const size_t esize = fmt == DG_PACK_F32 ? 4 : 2;
    out->data = dg_ws_get((size_t)(out->panels * out->kp * r) * esize + 64);
    if (!fold && op->sf && gblk > 0) {
        out->gblk = gblk;
        out->nkb = dg_ceil_div(op->k, gblk);
        out->scales = dg_malloc((size_t)(out->panels * out->nkb * r) * sizeof(float));
    }
    if (!out->data || (out->gblk && !out->scales)) {
        dg_engine_packed_free(out);
        return dg_fail(DG_ERR_ALLOC, "out of memory packing a %lld x %lld operand", (long long)op->mn,
                       (long long)op->k);
    }
    /* K = 0: empty panels; MN = 0: no panel (K may still be huge: no staging row is needed).
     * The operand (NULL data, any strides) is never addressed. */
    if (out->kp == 0 || out->panels == 0)
        return DG_OK;
    const dg_pack_bf16_fn fast = r <= 32 && isa ? isa->pack_bf16 : NULL;
    const dg_pack_bf16_fn fast_mn = fast ? isa->pack_bf16_mn : NULL;
    const int64_t stage_rows = fast ? r : 1;
    bool ok = true;
    /* No more threads than panels, and one for a small operand (a decoding call's A): a region
     * of two threads ends in a barrier that, on a shared core, waits for a descheduled thread. */
    const int64_t elems = out->panels * out->kp * r;
    const int threads = elems < (1 << 16) ? 1 : (int)(out->panels < dg_num_threads() ? out->panels : dg_num_threads());
#pragma omp parallel num_threads(threads) reduction(&& : ok)
    {
        uint16_t *row = dg_malloc((size_t)(stage_rows * out->kp) * 2 + 64);
        ok = row != NULL;
#pragma omp for schedule(static)
        for (int64_t p = 0; p < out->panels; ++p)
            if (row)
                pack_panel(op, fold, out, p, row, fast, fast_mn, isa);
        dg_free(row);
    }
    if (!ok) {
        dg_engine_packed_free(out);
        return dg_fail(DG_ERR_ALLOC, "out of memory packing an operand");
    }
    return DG_OK;
}

void dg_engine_packed_free(dg_packed *p) {
    dg_ws_put(p->data);
    dg_free(p->scales);
    p->data = NULL, p->scales = NULL;
}
