/*
 * prepack.c - B (the weight) packed once into the engine's NR-row panels, and the GEMM on it.
 *
 * The packed values are exactly those dg_engine_gemm packs per call (same packer, same
 * configuration, same folding decision), so the large-M path runs the same tile loop on them
 * (dg_engine_run_packed) and the small-M path runs the same kernels per K slice as smallm.c.
 * Per element the operation order is therefore the unpacked call's (engine.h), and D is
 * bitwise the same.
 * Panel format: where the configuration has a small-M path (AVX2, AVX-512 levels) the panels are
 * always DG_PACK_BF16, even when its large-M kernel takes DG_PACK_F32: decoding is bound by
 * reading B, and BF16 pairs are half the bytes. The small-M path reads them in place where its
 * kernels take BF16 pairs (VDPBF16PS), else widens each K slice to float32 in L1 (exact); a
 * large-M call on a float32 kernel widens the whole B once per call
 * (O(N K), as the unpacked call's own packing). Elsewhere the panels are the kernel's format.
 * On AMX (DG_PACK_AMX_B panels) small M streams the panels with A as 16-row AMX_A tiles
 * (kernels/amx/smallm_amx.c): the large-M kernel's TDPBF16PS steps per element, so the same bits.
 * FP8 B keeps its E4M3 codes besides (prepack.h: fp8_codes) on AMX, and small M runs smallm.c
 * on them (fp8_small): the unpacked call's own path, 1 byte per weight.
 */
#include "prepack.h"

#include "fp4x4.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#define PP_SMALL_KC 128 /* the K slice of the small-M path (smallm.c uses the same) */

static int gcd(int a, int b) { return b ? gcd(b, a % b) : a; }

void *dg_packed_alloc(size_t bytes) {
    const size_t huge = (size_t)2 << 20, align = bytes >= 2 * huge ? huge : 64;
    const size_t cap = (bytes + align - 1) / align * align;
    void *p = dg_aligned_alloc(align, cap);
#ifdef MADV_HUGEPAGE
    if (p && align == huge)
        madvise(p, cap, MADV_HUGEPAGE);
#endif
    return p;
}

/*
 * Moves the panels out of the workspace pool (workspace.c) into memory of their own: a packed
 * B lives for the program, and holding a pool slot would make every later GEMM allocate (and
 * the kernel zero) fresh pages for its own panels. Freed by dg_engine_packed_free (dg_ws_put
 * frees blocks that are not the pool's).
 */
static dg_status own_memory(dg_packed *pk) {
    const size_t es = pk->fmt == DG_PACK_F32 ? 4 : 2;
    const size_t bytes = (size_t)(pk->panels * pk->kp * pk->r) * es + 64;
    void *own = dg_packed_alloc(bytes);
    if (!own) {
        dg_engine_packed_free(pk);
        return dg_fail(DG_ERR_ALLOC, "out of memory for a packed B of %zu bytes", bytes);
    }
    memcpy(own, pk->data, bytes);
    dg_ws_put(pk->data);
    pk->data = own;
    return DG_OK;
}

/* K-major E4M3 codes [n][k] rearranged into the decode panels of engine.h (DG_DECODE_E4M3P),
 * zero past K and past row n. */
static void pack_e4m3_panels(const uint8_t *codes, int64_t n, int64_t k, uint8_t *out) {
    const int64_t steps = dg_ceil_div(k, 32), panels = dg_ceil_div(n, 16);
    memset(out, 0, (size_t)(panels * steps * DG_E4M3P_STEP_BYTES));
    for (int64_t row = 0; row < n; ++row) {
        uint8_t *panel = out + row / 16 * steps * DG_E4M3P_STEP_BYTES + 2 * (row % 16);
        for (int64_t kk = 0; kk < k; ++kk)
            panel[kk / 32 * DG_E4M3P_STEP_BYTES + 32 * (kk % 32 / 2) + (kk & 1)] = codes[row * k + kk];
    }
}

/* The E4M3 copy of b for small-M calls (prepack.h: fp8_codes), scales as float32, and its decode
 * panels (fp8p) where the configuration has kernels for them. */
static dg_status keep_fp8(const dg_engine_cfg *cfg, const dg_operand *b, struct dg_packed_b *out) {
    const int gmn = b->sf ? gcd(b->gran_mn, DG_PACKED_SLICE) : 1;
    const int64_t rows = b->sf ? dg_ceil_div(b->mn, gmn) : 0, nkb = b->sf ? dg_ceil_div(b->k, b->gran_k) : 0;
    const size_t code_bytes = (size_t)dg_align(b->mn * b->k, 64);
    const bool dec = cfg->decode[DG_DECODE_E4M3P] && !cfg->amx;
    const size_t sf_bytes = (size_t)dg_align((int64_t)((size_t)(rows * nkb) * sizeof(float)), 64);
    const size_t panel_bytes = dec ? (size_t)(dg_ceil_div(b->mn, 16) * dg_ceil_div(b->k, 32) * DG_E4M3P_STEP_BYTES) : 0;
    uint8_t *mem = dg_packed_alloc(code_bytes + sf_bytes + panel_bytes + 64);
    DG_CHECK(mem != NULL, DG_ERR_ALLOC, "out of memory for the FP8 codes of a packed B");
    const dg_tensor *t = b->data;
    const uint8_t *src = t->data;
    for (int64_t j = 0; j < b->mn; ++j) {
        uint8_t *row = mem + j * b->k;
        if (t->strides[1] == 1)
            memcpy(row, src + j * t->strides[0], (size_t)b->k);
        else
            for (int64_t kk = 0; kk < b->k; ++kk)
                row[kk] = src[j * t->strides[0] + kk * t->strides[1]];
    }
    float *sf = (float *)(void *)(mem + code_bytes);
    for (int64_t r = 0; r < rows; ++r) /* gmn divides gran_mn: the same value per element */
        for (int64_t q = 0; q < nkb; ++q)
            sf[r * nkb + q] = dg_operand_scale(b, 0, r * gmn, q * b->gran_k);
    out->fp8_mem = mem, out->fp8_codes = mem, out->fp8_sf = rows ? sf : NULL, out->fp8_gran_mn = gmn;
    out->fp8p = NULL;
    if (dec) {
        pack_e4m3_panels(mem, b->mn, b->k, mem + code_bytes + sf_bytes);
        out->fp8p = mem + code_bytes + sf_bytes;
    }
    return DG_OK;
}

/* K-major E2M1 codes [n][ceil(k / 2)] (low nibble first) rearranged into the decode panels of
 * engine.h (DG_DECODE_E2M1P), zero past K and past row n. */
static void pack_e2m1_panels(const uint8_t *codes, int64_t n, int64_t k, uint8_t *out) {
    const int64_t kh = (k + 1) / 2, steps = dg_ceil_div(k, 32), panels = dg_ceil_div(n, 16);
    memset(out, 0, (size_t)(panels * steps * DG_E2M1P_STEP_BYTES));
    for (int64_t row = 0; row < n; ++row) {
        uint8_t *panel = out + row / 16 * steps * DG_E2M1P_STEP_BYTES;
        const int r = (int)(row % 16), L = r / 4, q = r % 4;
        for (int64_t kk = 0; kk < k; ++kk) {
            const int code = (codes[row * kh + kk / 2] >> (4 * (kk & 1))) & 15;
            const int p = (int)(kk % 32) / 2, c = p / 4, t = p % 4, e = (int)(kk & 1);
            panel[kk / 32 * DG_E2M1P_STEP_BYTES + 64 * c + 16 * L + 2 * q + 8 * (t & 1) + e] |=
                (uint8_t)(code << (4 * (t >> 1)));
        }
    }
}

/* The same codes as DG_AMX_E2M1_PLANES (engine.h), zero past K and past row n. */
static void pack_e2m1_amx_planes(const uint8_t *codes, int64_t n, int64_t k, uint8_t *out) {
    const int64_t kh = (k + 1) / 2, steps = dg_ceil_div(k, 32), panels = dg_ceil_div(n, 16);
    memset(out, 0, (size_t)(panels * steps * DG_AMX_E2M1_STEP_BYTES));
    for (int64_t row = 0; row < n; ++row) {
        uint8_t *panel = out + row / 16 * steps * DG_AMX_E2M1_STEP_BYTES;
        const int g = (int)(row % 16) / 4, q = (int)(row % 4);
        for (int64_t kk = 0; kk < k; ++kk) {
            const int code = (codes[row * kh + kk / 2] >> (4 * (kk & 1))) & 15;
            /* word kk % 32 of group g, bits 4q .. 4q + 3: byte q / 2 of the word, nibble q % 2 */
            panel[kk / 32 * DG_AMX_E2M1_STEP_BYTES + 64 * g + 2 * (kk % 32) + q / 2] |= (uint8_t)(code << (4 * (q & 1)));
        }
    }
}

/* The FP4 copy of b (prepack.h: fp4_codes, fp4_sf) and, where the configuration has kernels for
 * them, its decode panels and their folded scales' exponents (fp4p), in one block; out->fold_b
 * is set. */
static dg_status keep_fp4(const dg_engine_cfg *cfg, const dg_operand *b, struct dg_packed_b *out) {
    const int64_t kh = (b->k + 1) / 2, nkb = dg_ceil_div(b->k, b->gran_k), panels = dg_ceil_div(b->mn, 16);
    const size_t code_bytes = (size_t)dg_align(b->mn * kh, 64);
    const bool dec = cfg->decode[DG_DECODE_E2M1P] && !cfg->amx, planes = cfg->amx;
    _Static_assert(DG_AMX_E2M1_STEP_BYTES == DG_E2M1P_STEP_BYTES, "the two panel formats are sliced alike");
    const size_t pcode_bytes = dec || planes ? (size_t)(panels * dg_ceil_div(b->k, 32) * DG_E2M1P_STEP_BYTES) : 0;
    const size_t psf_bytes = dec || planes ? (size_t)dg_align(panels * nkb * 16 + panels, 64) : 0; /* sfe, exact */
    const size_t sf_bytes = (size_t)(b->mn * nkb) * sizeof(float);
    uint8_t *mem = dg_calloc(code_bytes + pcode_bytes + psf_bytes + sf_bytes + 64, 1);
    DG_CHECK(mem != NULL, DG_ERR_ALLOC, "out of memory for a packed FP4 B");
    uint8_t *sfe = mem + code_bytes + pcode_bytes, *exact = dec || planes ? sfe + panels * nkb * 16 : NULL;
    float *sf = (float *)(void *)(mem + code_bytes + pcode_bytes + psf_bytes);
    for (int64_t j = 0; j < b->mn; ++j) {
        for (int64_t kk = 0; kk < b->k; ++kk)
            mem[j * kh + kk / 2] |= (uint8_t)(dg_float_to_e2m1(dg_operand_raw(b, 0, j, kk)) << (4 * (kk & 1)));
        for (int64_t q = 0; q < nkb; ++q)
            sf[j * nkb + q] = dg_operand_scale(b, 0, j, q * b->gran_k);
    }
    out->fp4_mem = mem, out->fp4_codes = mem, out->fp4_sf = sf;
    memset(&out->fp4p, 0, sizeof out->fp4p);
    if (!dec && !planes)
        return DG_OK;
    if (planes) /* the AMX small-M kernel's layout */
        pack_e2m1_amx_planes(mem, b->mn, b->k, mem + code_bytes);
    else
        pack_e2m1_panels(mem, b->mn, b->k, mem + code_bytes);
    out->fp4p.codes = mem + code_bytes;
    if (!out->fold_b) /* kept scales: the decode call reads them as floats (smallm.c, block_scales) */
        return DG_OK;
    for (int64_t p = 0; p < panels; ++p) {
        int ok = 1;
        for (int64_t q = 0; q < nkb; ++q)
            for (int r = 0; r < 16; ++r) {
                const float s = 16 * p + r < b->mn ? sf[(16 * p + r) * nkb + q] : 1.0f;
                uint32_t bits;
                memcpy(&bits, &s, sizeof bits);
                sfe[(p * nkb + q) * 16 + r] = (uint8_t)(bits >> 23); /* 2^(byte - 127) where exact */
                ok &= planes ? dg_amx_e2m1_scale_ok(s) : dg_decode_fold_exact(s, 1.0f);
            }
        exact[p] = (uint8_t)ok;
    }
    out->fp4p.sfe = sfe, out->fp4p.exact = exact;
    return DG_OK;
}

dg_status dg_engine_prepack_b(const dg_operand *b, struct dg_packed_b *out) {
    const dg_engine_cfg *cfg = dg_engine_config(dg_get_isa());
    dg_operand none; /* an unscaled A: the plan then says only how B's scales are applied */
    memset(&none, 0, sizeof none);
    none.groups = 1, none.fp4_dim = -1;
    dg_scale_plan plan;
    DG_CHECK(dg_engine_plan_scales(&none, b, &plan), DG_ERR_UNSUPPORTED,
             "argument 'b': scale blocks of odd length (gran_k = %d) cannot be pre-packed", b->gran_k);
    /* B's own scale blocks are not whole AMX k steps (NVFP4's 16, not folded): every call
     * would take the fallback level (dg_engine_config_for), so B is packed for it, which the
     * packed call accepts at AMX. Where only A's blocks are such, see dg_engine_gemm_prepacked. */
    cfg = dg_engine_config_for(cfg, &plan);
    out->cfg = cfg;
    out->fold_b = plan.fold_b;
    out->n = b->mn, out->k = b->k;
    const dg_pack_fmt fmt = cfg->pack_bf16 && cfg->ukr_small[0] ? DG_PACK_BF16 : cfg->fmt;
    if (b->data->dtype == DG_FP4_E2M1X2 && b->k > 0 && b->sf)
        DG_TRY(keep_fp4(cfg, b, out));
    dg_operand one; /* whether this configuration has a small-M path at all */
    memset(&one, 0, sizeof one);
    one.mn = 1;
    dg_status st = DG_OK;
    if (b->data->dtype == DG_FLOAT8_E4M3 && b->mn > 0 && b->k > 0 && (cfg->amx || cfg->decode[DG_DECODE_E4M3]) &&
        dg_engine_small_applies(cfg, &one, b))
        st = keep_fp8(cfg, b, out);
    if (st == DG_OK)
        st = dg_engine_pack(b, plan.fold_b, plan.gblk, fmt, cfg->nr, cfg, &out->pk);
    st = st == DG_OK ? own_memory(&out->pk) : st;
    if (st != DG_OK) {
        dg_free(out->fp4_mem);
        dg_free(out->fp8_mem);
        out->fp4_mem = NULL, out->fp4_codes = NULL, out->fp4_sf = NULL;
        memset(&out->fp4p, 0, sizeof out->fp4p);
        out->fp8_mem = NULL, out->fp8_codes = NULL, out->fp8_sf = NULL, out->fp8p = NULL;
    }
    return st;
}

/* An FP4 A with an FP4 B runs the unpacked call's integer path on B's kept codes. */
static bool fp4x4_prepacked(const dg_operand *a, const struct dg_packed_b *b, const dg_tensor *d, const dg_tensor *c,
                            dg_status *st) {
    if (!b->fp4_codes || a->data->dtype != DG_FP4_E2M1X2)
        return false;
    const int64_t kh = (b->k + 1) / 2, nkb = dg_ceil_div(b->k, b->gran_b[1]);
    dg_tensor t = dg_tensor_2d((void *)b->fp4_codes, DG_FP4_E2M1X2, b->n, kh);
    dg_tensor sf = dg_tensor_2d((void *)b->fp4_sf, DG_FLOAT32, b->n, nkb);
    dg_operand ob;
    memset(&ob, 0, sizeof ob);
    ob.data = &t, ob.sf = &sf, ob.groups = 1, ob.mn = b->n, ob.k = b->k, ob.fp4_dim = 1;
    ob.gran_mn = 1, ob.gran_k = b->gran_b[1];
    if (!dg_engine_fp4x4_applies(a, &ob))
        return false;
    *st = dg_engine_gemm_fp4x4(a, &ob, d, c);
    return true;
}

/* A view of pb whose kept scales are re-gridded to blocks of gblk (a divisor of pb->gblk). */
static dg_status regrid(const dg_packed *pb, int gblk, dg_packed *view) {
    *view = *pb;
    if (!pb->scales || pb->gblk == gblk)
        return DG_OK;
    view->gblk = gblk;
    view->nkb = dg_ceil_div(pb->k, gblk);
    view->scales = dg_malloc((size_t)(pb->panels * view->nkb * pb->r) * sizeof(float) + 4);
    DG_CHECK(view->scales != NULL, DG_ERR_ALLOC, "out of memory re-gridding the scales of 'b'");
    for (int64_t p = 0; p < pb->panels; ++p)
        for (int64_t kb = 0; kb < view->nkb; ++kb)
            memcpy(view->scales + (p * view->nkb + kb) * pb->r,
                   pb->scales + (p * pb->nkb + kb * gblk / pb->gblk) * pb->r, (size_t)pb->r * sizeof(float));
    return DG_OK;
}

/* ---- small M (mirrors smallm.c with B read from its panels) --------------------------------- */

typedef struct pp_job {
    const dg_engine_cfg *cfg;
    const dg_packed *pa, *pb;
    dg_ukr_fn ukr;
    int mr, gblk;
    int64_t slice;
    const float *ones;
} pp_job;

/* BF16 pair panel rows (r, k) for k pairs [0, pairs) -> float32 [2 * pairs][r] (exact). The
 * word (k pair q, row i) holds k = 2q in its low half, 2q + 1 in its high half. BF16 panels
 * with float32 kernels occur on the AVX2 and AVX-512 configurations (dg_engine_prepack_b). */
static void widen_pairs(const uint32_t *src, int64_t pairs, int r, uint32_t *dst) {
#if defined(__x86_64__) || defined(_M_X64)
    if (dg_get_isa() >= DG_ISA_AVX512) {
        dg_widen_pairs_avx512(src, pairs, r, dst);
        return;
    }
    if (dg_get_isa() >= DG_ISA_AVX2) {
        dg_widen_pairs_avx2(src, pairs, r, dst);
        return;
    }
#endif
    for (int64_t q = 0; q < pairs; ++q) {
        const uint32_t *s = src + q * r;
        uint32_t *lo = dst + 2 * q * r, *hi = lo + r;
        for (int i = 0; i < r; ++i) {
            lo[i] = s[i] << 16;
            hi[i] = s[i] & 0xffff0000u;
        }
    }
}

/* B panel jb, k in [k0, k0 + kc), in the small-M kernels' format: in place when the panels have it
 * (float32 panels, or BF16 pairs for VDPBF16PS kernels), else BF16 pairs widened to float32 [kc][NR]. */
static const void *slice_b(const pp_job *j, int64_t jb, int64_t k0, int64_t kc, float *bbuf) {
    const dg_packed *pb = j->pb;
    const int nr = pb->r;
    if (pb->fmt == DG_PACK_F32)
        return (const float *)pb->data + jb * pb->kp * nr + k0 * nr;
    if (j->cfg->small_fmt == DG_PACK_BF16)
        return (const uint16_t *)pb->data + jb * pb->kp * nr + k0 * nr;
    /* k0 and kc are even (kp is even, slices are multiples of 2) */
    widen_pairs((const uint32_t *)pb->data + jb * (pb->kp / 2) * nr + (k0 / 2) * nr, kc / 2, nr, (uint32_t *)bbuf);
    return bbuf;
}

/* A float32-panel copy of BF16-pair panels (for a large-M call on a float32 kernel). */
static dg_status widen_all(const dg_packed *pb, dg_packed *out) {
    *out = *pb;
    out->fmt = DG_PACK_F32;
    out->data = dg_ws_get((size_t)(pb->panels * pb->kp * pb->r) * sizeof(float) + 64);
    DG_CHECK(out->data != NULL, DG_ERR_ALLOC, "out of memory widening the packed 'b'");
#pragma omp parallel for schedule(static) num_threads(dg_num_threads())
    for (int64_t p = 0; p < pb->panels; ++p)
        widen_pairs((const uint32_t *)pb->data + p * (pb->kp / 2) * pb->r, pb->kp / 2, pb->r,
                    (uint32_t *)out->data + p * pb->kp * pb->r);
    return DG_OK;
}

static void pp_block(const pp_job *j, int64_t jb, float *bbuf, float *cbuf) {
    const dg_packed *pa = j->pa, *pb = j->pb;
    const int nr = pb->r, mr = j->mr, gblk = j->gblk;
    const int64_t kp = pa->kp;
    const size_t es = j->cfg->small_fmt == DG_PACK_F32 ? 4 : 2; /* bytes per element of A and of B's slice */
    memset(cbuf, 0, (size_t)(pa->panels * mr * nr) * sizeof(float));
    for (int64_t k0 = 0; k0 < kp; k0 += j->slice) {
        const int64_t kc = kp - k0 < j->slice ? kp - k0 : j->slice;
        const char *bs = slice_b(j, jb, k0, kc, bbuf);
        for (int64_t ir = 0; ir < pa->panels; ++ir) {
            const char *ap = (const char *)pa->data + (size_t)(ir * kp * mr) * es;
            for (int64_t kb0 = k0; kb0 < k0 + kc; kb0 += gblk) { /* one scale epilogue per block */
                const int64_t kb1 = kb0 + gblk < k0 + kc ? kb0 + gblk : k0 + kc;
                const float *sbp = pb->scales ? pb->scales + (jb * pb->nkb + kb0 / gblk) * nr : j->ones;
                const float *sap = pa->scales ? pa->scales + (ir * pa->nkb + kb0 / gblk) * mr : j->ones;
                j->ukr(kb1 - kb0, ap + (size_t)(kb0 * mr) * es, bs + (size_t)((kb0 - k0) * nr) * es,
                       cbuf + ir * mr * nr, nr, DG_UKR_SCALE, sap, sbp);
            }
        }
    }
}

#if (defined(__x86_64__) || defined(_M_X64)) && defined(DG_HAVE_AMX)
/* ---- small M on AMX: A as 16-row tiles against the 32-column panels (smallm_amx.c) ---------- */

#define PP_AMX_KC 1024 /* k per kernel call: beyond M = 32 the panel piece (64 KiB) is re-read from L2 */
#define PP_AMX_PF 8192 /* bytes ahead in the panel to prefetch: 4 k steps (the stream is contiguous) */

/* One kernel call over k in [k0, k1) for every pair of A tiles. */
static void pp_run(const dg_packed *pa, const uint16_t *bp, int64_t k0, int64_t k1, int64_t pf, float *out,
                   int accumulate) {
    const int mt = (int)pa->panels;
    const int64_t kp = pa->kp;
    for (int p = 0; p < mt; p += 2)
        dg_amx_small_pp((k1 - k0) / 32, (const uint16_t *)pa->data + p * kp * 16 + k0 * 16, kp * 16,
                        mt - p < 2 ? 1 : 2, bp + k0 * 32, p == 0 ? pf : 0, out + p * 512, accumulate);
}

/* Panel jb of B into total [16 mt][32]. */
static void pp_block_amx(const dg_packed *pa, const dg_packed *pb, int gblk, int64_t jb, int64_t pf, float *acc,
                         float *total, const float *ones) {
    const int mt = (int)pa->panels;
    const int64_t kp = pa->kp, slice = gblk * (PP_AMX_KC / gblk > 0 ? PP_AMX_KC / gblk : 1);
    const uint16_t *bp = (const uint16_t *)pb->data + jb * kp * 32;
    memset(total, 0, (size_t)mt * 512 * sizeof(float));
    dg_amx_small_begin();
    for (int64_t k0 = 0; k0 < kp; k0 += slice) {
        const int64_t k1 = kp - k0 < slice ? kp : k0 + slice;
        if (!pa->scales && !pb->scales) { /* one tile chain over K (engine.h) */
            pp_run(pa, bp, k0, k1, pf, total, k0 > 0);
            continue;
        }
        for (int64_t kb0 = k0; kb0 < k1; kb0 += gblk) { /* one scale epilogue per block */
            const int64_t kb1 = kb0 + gblk < k1 ? kb0 + gblk : k1, kb = kb0 / gblk;
            pp_run(pa, bp, kb0, kb1, pf, acc, 0);
            const float *sbp = pb->scales ? pb->scales + (jb * pb->nkb + kb) * 32 : ones;
            for (int p = 0; p < mt; ++p)
                dg_amx_small_pp_scale(acc + p * 512, total + p * 512,
                                      pa->scales ? pa->scales + (p * pa->nkb + kb) * 16 : ones, sbp);
        }
    }
}

static dg_status pp_small_amx(const dg_engine_cfg *cfg, const dg_operand *a, int fold_a, int gblk,
                              const dg_packed *pb, const dg_tensor *d, const dg_tensor *c) {
    if (a->mn == 0 || pb->mn == 0)
        return DG_OK;
    dg_packed pa;
    DG_TRY(dg_engine_pack(a, fold_a, gblk, DG_PACK_AMX_A, 16, cfg, &pa));
    const int64_t n = pb->mn, blocks = pb->panels, mt = pa.panels;
    const int64_t pf = PP_AMX_PF;
    const int threads = (int)(blocks < dg_num_threads() ? blocks : dg_num_threads());
    const int64_t per_thread = dg_align(2 * mt * 512 + 32, 16); /* total, acc, ones */
    float *mem = dg_malloc((size_t)(threads * per_thread) * sizeof(float));
    if (!mem) {
        dg_engine_packed_free(&pa);
        return dg_fail(DG_ERR_ALLOC, "out of memory for the small-M GEMM buffers");
    }
#pragma omp parallel num_threads(threads)
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        float *total = mem + tid * per_thread, *acc = total + mt * 512, *ones = acc + mt * 512;
        for (int s = 0; s < 32; ++s)
            ones[s] = 1.0f;
#pragma omp for schedule(dynamic, 2)
        for (int64_t jb = 0; jb < blocks; ++jb) {
            const int64_t n0 = jb * 32, cols = n - n0 < 32 ? n - n0 : 32;
            pp_block_amx(&pa, pb, gblk, jb, pf, acc, total, ones);
            for (int64_t i = 0; i < a->mn; ++i)
                dg_engine_store_row(d, c, i, n0, cols, total + i * 32);
        }
    }
    dg_free(mem);
    dg_engine_packed_free(&pa);
    return DG_OK;
}
#endif

/* M <= 2 on BF16-pair panels: the configuration's pair decode kernel, two panels per call
 * (engine.h: DG_DECODE_PAIRS), the same bits as pp_block. */
static bool pp_decode_applies(const dg_engine_cfg *cfg, const dg_operand *a, const dg_packed *pb) {
    return a->mn >= 1 && a->mn <= 2 && cfg->decode[DG_DECODE_PAIRS] && pb->fmt == DG_PACK_BF16 && pb->r == 16 &&
           pb->kp > 0;
}

static dg_status pp_decode(const dg_engine_cfg *cfg, const dg_operand *a, int fold_a, int gblk, const dg_packed *pb,
                           const dg_tensor *d, const dg_tensor *c) {
    dg_decode_a da;
    DG_TRY(dg_engine_decode_a(cfg, a, fold_a, gblk, &da));
    const int64_t items = dg_ceil_div(pb->panels, 2), n = pb->mn, nkb = da.nkb;
    const int threads = (int)(items < dg_num_threads() ? items : dg_num_threads());
    float *mem = dg_malloc((size_t)(threads * (32 * nkb + 64)) * sizeof(float));
    if (!mem) {
        dg_engine_decode_a_free(&da);
        return dg_fail(DG_ERR_ALLOC, "out of memory for the decoding GEMM buffers");
    }
#pragma omp parallel num_threads(threads)
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        float *sb = mem + tid * (32 * nkb + 64), *out = sb + 32 * nkb;
#pragma omp for schedule(dynamic, 2) /* any order: each item's result is fixed */
        for (int64_t it = 0; it < items; ++it) {
            const int64_t p0 = 2 * it, n0 = p0 * 16, cols = n - n0 < 32 ? n - n0 : 32;
            for (int64_t kb = 0; kb < nkb; ++kb) /* the panels' kept scales, as pp_block reads them */
                for (int r = 0; r < 32; ++r) {
                    const int64_t p = p0 + r / 16;
                    sb[kb * 32 + r] = pb->scales && p < pb->panels && kb < pb->nkb
                                          ? pb->scales[(p * pb->nkb + kb) * 16 + r % 16] : 1.0f;
                }
            const size_t panel_bytes = (size_t)(pb->kp * 16) * 2;
            const dg_decode_job job = {(const uint8_t *)pb->data + p0 * panel_bytes, (int64_t)panel_bytes, (int)cols,
                                       pb->kp, da.rows, da.lda, (int)a->mn, gblk, da.sa, sb, nkb, 0, NULL, out, NULL, NULL, 32,
                                       NULL, 0, NULL, 0, 0, 0, false, false, false};
            cfg->decode[DG_DECODE_PAIRS](&job);
            for (int64_t i = 0; i < a->mn; ++i)
                dg_engine_store_row(d, c, i, n0, cols, out + i * 32);
        }
    }
    dg_free(mem);
    dg_engine_decode_a_free(&da);
    return DG_OK;
}

static dg_status pp_small(const dg_engine_cfg *cfg, const dg_operand *a, int fold_a, int gblk, const dg_packed *pb,
                          const dg_tensor *d, const dg_tensor *c) {
    if (pp_decode_applies(cfg, a, pb))
        return pp_decode(cfg, a, fold_a, gblk, pb, d, c);
#if (defined(__x86_64__) || defined(_M_X64)) && defined(DG_HAVE_AMX)
    if (cfg->amx)
        return pp_small_amx(cfg, a, fold_a, gblk, pb, d, c);
#endif
    int mr;
    const int which = dg_engine_small_kernel(cfg, a->mn, &mr);
    pp_job j = {cfg, NULL, pb, cfg->ukr_small[which], mr, gblk, PP_SMALL_KC, NULL};
    j.slice = gblk * (PP_SMALL_KC / gblk > 0 ? PP_SMALL_KC / gblk : 1);
    dg_packed pa;
    DG_TRY(dg_engine_pack(a, fold_a, gblk, cfg->small_fmt, j.mr, cfg, &pa));
    j.pa = &pa;
    const int nr = pb->r;
    const int64_t n = pb->mn, blocks = pb->panels, mpad = pa.panels * j.mr;
    const int threads = (int)(blocks < dg_num_threads() ? blocks : dg_num_threads());
    const int64_t per_thread = dg_align(j.slice * nr + mpad * nr + nr + 8, 16);
    float *mem = dg_malloc((size_t)(threads * per_thread) * sizeof(float));
    if (!mem) {
        dg_engine_packed_free(&pa);
        return dg_fail(DG_ERR_ALLOC, "out of memory for the small-M GEMM buffers");
    }
#pragma omp parallel num_threads(threads)
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        float *bbuf = mem + tid * per_thread, *cbuf = bbuf + j.slice * nr, *ones = cbuf + mpad * nr;
        pp_job jt = j;
        for (int s = 0; s < nr + 8; ++s)
            ones[s] = 1.0f;
        jt.ones = ones;
#pragma omp for schedule(dynamic, 4)
        for (int64_t jb = 0; jb < blocks; ++jb) {
            const int64_t n0 = jb * nr, cols = n - n0 < nr ? n - n0 : nr;
            pp_block(&jt, jb, bbuf, cbuf);
            for (int64_t i = 0; i < a->mn; ++i)
                dg_engine_store_row(d, c, i, n0, cols, cbuf + i * nr);
        }
    }
    dg_free(mem);
    dg_engine_packed_free(&pa);
    return DG_OK;
}

/* A small-M call on an FP8 B runs the unpacked call's small-M path on the kept codes (prepack.h:
 * fp8_codes) with the scale plan the unpacked call makes (B's part fixed at packing). */
static bool fp8_small(const dg_engine_cfg *cfg, const dg_operand *a, const struct dg_packed_b *b, int fold_a,
                      int gblk, const dg_tensor *d, const dg_tensor *c, dg_status *st) {
    dg_tensor t, sf;
    dg_operand ob;
    memset(&ob, 0, sizeof ob);
    t = dg_tensor_2d((void *)b->fp8_codes, DG_FLOAT8_E4M3, b->n, b->k);
    ob.data = &t, ob.groups = 1, ob.mn = b->n, ob.k = b->k, ob.fp4_dim = -1;
    if (!b->fp8_codes || !dg_engine_small_applies(cfg, a, &ob))
        return false;
    /* Above M = 2 staging codes per K slice costs more than widening the BF16 panels; decode
     * panels (fp8p) serve M up to the narrow decode kernels' bound where those take the blocks
     * (smallm.c, decode_declines). */
    const bool panels = b->fp8p && a->mn <= DG_DECODE_MAX_M && gblk % DG_DECODE_STEP == 0 &&
                        (!b->fold_b || b->gran_b[1] % DG_DECODE_STEP == 0);
    if (!cfg->amx && a->mn > 2 && !panels)
        return false;
    if (b->fp8_sf) {
        sf = dg_tensor_2d((void *)b->fp8_sf, DG_FLOAT32, dg_ceil_div(b->n, b->fp8_gran_mn),
                          dg_ceil_div(b->k, b->gran_b[1]));
        ob.sf = &sf, ob.gran_mn = b->fp8_gran_mn, ob.gran_k = b->gran_b[1];
    }
    const dg_scale_plan plan = {fold_a, b->fold_b, gblk};
    const dg_e2m1_panels pp = {b->fp8p, NULL, NULL};
    *st = dg_engine_gemm_small_panels(cfg, a, &ob, panels ? &pp : NULL, &plan, d, c);
    return true;
}

/* A decoding call (a configuration with decode kernels; M <= 2, or with decode panels M up to
 * the decode kernels' bound) with an FP4 B and another A runs the unpacked call's small-M path
 * on B's kept codes (0.5 bytes per weight instead of the BF16 panels' 2), the decode kernels
 * on its decode panels where it has them, with the plan the unpacked call makes (B's part
 * fixed at packing). */
static bool fp4_small(const dg_engine_cfg *cfg, const dg_operand *a, const struct dg_packed_b *b, int fold_a,
                      int gblk, const dg_tensor *d, const dg_tensor *c, dg_status *st) {
    /* AMX: every small-M call, as the unpacked call runs them (smallm.c, amx_small: B's codes
     * widened inside the tile loop), reading 0.5 bytes per weight instead of the panels' 2
     * (Sapphire Rapids VM, N 7168 K 2048, 2 threads: M = 16 2.99-3.24 -> 2.06-2.69 ms on the
     * rows widened per chunk, 1.01-1.12 ms with the tile-loop widening; M = 1 0.93-1.08 ms) */
    const int64_t max_m = cfg->amx ? dg_engine_small_m_max(cfg)
                          : !b->fp4p.codes ? 2
                          : cfg->decode_wide[DG_DECODE_E2M1P] ? cfg->decode_wide_max_m
                                                             : DG_DECODE_MAX_M;
    if (!b->fp4_codes || a->data->dtype == DG_FP4_E2M1X2 || (!cfg->amx && !cfg->decode[DG_DECODE_E2M1]) ||
        a->mn > max_m)
        return false;
    /* above M = 2 only where the decode kernels take the blocks (smallm.c, decode_declines):
     * the small-M kernels on codes are slower than on the BF16 panels */
    if (!cfg->amx && a->mn > 2 && (gblk % DG_DECODE_STEP || (b->fold_b && b->gran_b[1] % DG_DECODE_STEP)))
        return false;
    const int64_t kh = (b->k + 1) / 2, nkb = dg_ceil_div(b->k, b->gran_b[1]);
    dg_tensor t = dg_tensor_2d((void *)b->fp4_codes, DG_FP4_E2M1X2, b->n, kh);
    dg_tensor sf = dg_tensor_2d((void *)b->fp4_sf, DG_FLOAT32, b->n, nkb);
    dg_operand ob;
    memset(&ob, 0, sizeof ob);
    ob.data = &t, ob.sf = &sf, ob.groups = 1, ob.mn = b->n, ob.k = b->k, ob.fp4_dim = 1;
    ob.gran_mn = 1, ob.gran_k = b->gran_b[1];
    if (!dg_engine_small_applies(cfg, a, &ob))
        return false;
    const dg_scale_plan plan = {fold_a, b->fold_b, gblk};
    *st = dg_engine_gemm_small_panels(cfg, a, &ob, b->fp4p.codes ? &b->fp4p : NULL, &plan, d, c);
    return true;
}

/* ---- the GEMM ------------------------------------------------------------------------------ */

/* B as the unpacked operand of its kept codes (FP4 or FP8 B with them, see prepack.h), its
 * scales as float32; false when B kept none. */
static bool codes_operand(const struct dg_packed_b *b, dg_tensor *t, dg_tensor *sf, dg_operand *ob) {
    memset(ob, 0, sizeof *ob);
    ob->groups = 1, ob->mn = b->n, ob->k = b->k, ob->fp4_dim = -1;
    const int64_t nkb = b->gran_b[1] > 0 ? dg_ceil_div(b->k, b->gran_b[1]) : 0;
    if (b->fp4_codes) {
        *t = dg_tensor_2d((void *)b->fp4_codes, DG_FP4_E2M1X2, b->n, (b->k + 1) / 2);
        *sf = dg_tensor_2d((void *)b->fp4_sf, DG_FLOAT32, b->n, nkb);
        ob->fp4_dim = 1, ob->gran_mn = 1;
    } else if (b->fp8_codes) {
        *t = dg_tensor_2d((void *)b->fp8_codes, DG_FLOAT8_E4M3, b->n, b->k);
        if (b->fp8_sf) {
            *sf = dg_tensor_2d((void *)b->fp8_sf, DG_FLOAT32, dg_ceil_div(b->n, b->fp8_gran_mn), nkb);
            ob->gran_mn = b->fp8_gran_mn;
        }
    } else {
        return false;
    }
    ob->data = t;
    if (b->fp4_codes || b->fp8_sf)
        ob->sf = sf, ob->gran_k = b->gran_b[1];
    return true;
}

dg_status dg_engine_prepacked_cfg(const struct dg_packed_b *b, const dg_engine_cfg **cfg) {
    const dg_engine_cfg *cur = dg_engine_config(dg_get_isa());
    const bool fallback = cur->amx && b->cfg == dg_engine_config(cur->fallback);
    DG_CHECK(cur == b->cfg || fallback, DG_ERR_VALUE,
             "argument 'b' was packed for the '%s' kernel, but the current ISA runs '%s' (dg_set_isa "
             "changed it since); pack B again",
             b->cfg->name, cur->name);
    if (fallback)
        DG_PATH("%s instead of %s [B pre-packed with scale blocks of %d: not whole AMX k steps (32)]", b->cfg->name,
                cur->name, b->gran_b[1]);
    *cfg = b->cfg;
    return DG_OK;
}

dg_status dg_engine_gemm_prepacked(const dg_operand *a, const struct dg_packed_b *b, const dg_tensor *d,
                                   const dg_tensor *c) {
    const dg_engine_cfg *cfg;
    DG_TRY(dg_engine_prepacked_cfg(b, &cfg));
    dg_status st4;
    if (fp4x4_prepacked(a, b, d, c, &st4))
        return st4;
    /* The scale plan dg_engine_plan_scales makes for this pair (B's part fixed at packing). */
    const int fold_a = !a->sf || a->sf_packed;
    const int gblk = dg_engine_k_block(fold_a ? 0 : a->gran_k, b->pk.scales ? b->pk.gblk : 0, b->k);
    DG_CHECK(gblk % 2 == 0, DG_ERR_UNSUPPORTED,
             "scale blocks of odd length (gran_k %d) are outside the engine; use the unpacked GEMM", gblk);
    if (cfg->amx && gblk % 32 != 0) {
        /* A's scale blocks (B's fold into its panels) make K blocks that are not whole AMX k
         * steps: the unpacked call then runs the fallback level, and so does this one, on B's
         * kept codes (the same values and scale plan, so the same bits) */
        dg_tensor t, sf;
        dg_operand ob;
        DG_CHECK(codes_operand(b, &t, &sf, &ob), DG_ERR_UNSUPPORTED,
                 "A's scale blocks make K blocks of %d elements, not whole AMX k steps (32), and B was packed "
                 "for AMX tiles; use the unpacked GEMM",
                 gblk);
        return dg_engine_gemm(a, &ob, d, c);
    }
    dg_status st;
    if (fp8_small(cfg, a, b, fold_a, gblk, d, c, &st) || fp4_small(cfg, a, b, fold_a, gblk, d, c, &st))
        return st;
    dg_packed pb;
    DG_TRY(regrid(&b->pk, gblk, &pb));
    dg_operand ob;
    memset(&ob, 0, sizeof ob);
    ob.mn = b->n, ob.k = b->k, ob.groups = 1, ob.fp4_dim = -1;
    if (dg_engine_small_applies(cfg, a, &ob)) {
        st = pp_small(cfg, a, fold_a, gblk, &pb, d, c);
    } else {
        dg_packed pa, wide = pb;
        st = pb.fmt != cfg->fmt ? widen_all(&pb, &wide) : DG_OK;
        if (st == DG_OK)
            st = dg_engine_pack(a, fold_a, gblk, dg_engine_fmt_a(cfg), cfg->mr, cfg, &pa);
        if (st == DG_OK) {
            st = dg_engine_run_packed(cfg, &pa, &wide, gblk, d, c);
            dg_engine_packed_free(&pa);
        }
        if (wide.data != pb.data)
            dg_ws_put(wide.data);
    }
    if (pb.scales != b->pk.scales)
        dg_free(pb.scales);
    return st;
}
