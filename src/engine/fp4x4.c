/*
 * fp4x4.c - FP4 x FP4 GEMMs on integer dot products (order and panels: fp4x4.h).
 *
 *   large M: pack A and B once into int8 panels (parallel over panels), then MC x NC output
 *            tiles (OpenMP, whole tiles per thread), K in slices of KC steps, jr over B
 *            panels, ir over A panels, the microkernel accumulating into a float32 tile buffer
 *   small M (<= SMALL_M): A packed once; each thread takes a contiguous range of B panels of
 *            32 columns, decodes each panel's FP4 codes into an L2 buffer (prefetching the
 *            next panel) and runs all A panels over it: B is read from memory once, as FP4
 * K is never split across threads and every path runs the same kernel over the same blocks
 * in the same order, so D is bitwise independent of M, tiling and thread count; the int32
 * block sums are exact, so the kernels of all ISA levels give the same bits too.
 */
#include "fp4x4.h"

#include <pthread.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__x86_64__) || defined(_M_X64)
#define DG_X86 1
#else
#define DG_X86 0
#endif

#define PANEL_BYTES (DG_F4_MR * DG_F4_KS) /* one k step of a panel (A and B alike) */
#define SMALL_M 64

/* One ISA's choice: kernel, A's bias, blocking (MC, NC in rows; KC in k steps). */
typedef struct f4_cfg {
    dg_f4_ukr_fn ukr;
    void (*begin)(void);
    int a_bias;
    int mc, nc, kc_steps;
    const char *name; /* the path report's name of ukr */
} f4_cfg;

/* The kernel for M rows of A at the current ISA level. For M <= VNNI_M the VNNI kernel is
 * faster than tiles of 16 mostly empty rows, also on AMX (same bits: the sums are exact). */
#define VNNI_M 4
static f4_cfg config_now(int64_t m) {
    const dg_isa isa = dg_get_isa();
    f4_cfg c = {dg_f4_ukr_generic, NULL, 0, 256, 256, 32, "generic int32"};
#if DG_X86
#if defined(DG_HAVE_AMX)
    if (isa >= DG_ISA_AMX && m > VNNI_M)
        c.ukr = dg_f4_ukr_amx, c.begin = dg_f4_ukr_amx_begin, c.name = "amx int8 tiles";
    else
#endif
    if (isa >= DG_ISA_AVX512_BF16)
        c.ukr = dg_f4_ukr_vnni, c.a_bias = 12, c.name = "avx512 VNNI";
    else if (isa >= DG_ISA_AVX2)
        c.ukr = dg_f4_ukr_avx2, c.a_bias = 12, c.name = "avx2 VPMADDUBSW";
#else
    (void)isa, (void)m;
#endif
    return c;
}

static int gcd(int a, int b) { return b ? gcd(b, a % b) : a; }

bool dg_engine_fp4x4_applies(const dg_operand *a, const dg_operand *b) {
    if (a->grouped || b->grouped || a->data->dtype != DG_FP4_E2M1X2 || b->data->dtype != DG_FP4_E2M1X2)
        return false;
    if (!a->sf || !b->sf || a->k <= 0 || a->gran_k <= 0 || b->gran_k <= 0)
        return false;
    return gcd(a->gran_k, b->gran_k) % 32 == 0;
}

/* ---- decoding ------------------------------------------------------------------------------ */

static const int8_t kV2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12}; /* 2 x E2M1 */
static uint16_t g_pair[256]; /* a byte's two codes as two int8 (low nibble first) */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void init_pair(void) {
    for (int v = 0; v < 256; ++v)
        g_pair[v] = (uint16_t)((uint8_t)kV2[v & 15] | (uint16_t)(uint8_t)kV2[v >> 4] << 8);
}

/* out[0 .. k1 - k0) = 2 x row i of op for k in [k0, k1) (k0 even), zero for k >= K. */
static void fetch(const dg_operand *op, int64_t i, int64_t k0, int64_t k1, int8_t *out) {
    const dg_tensor *t = op->data;
    const uint8_t *base = t->data;
    const int64_t s0 = t->strides[0], s1 = t->strides[1], ke = k1 < op->k ? k1 : op->k;
    int64_t kk = k0;
    if (op->fp4_dim == 1 && s1 == 1) {
        const uint8_t *p = base + i * s0 + k0 / 2;
        for (; kk + 1 < ke; kk += 2)
            memcpy(out + (kk - k0), &g_pair[p[(kk - k0) / 2]], 2);
        if (kk < ke) /* odd K (an operand built by the engine itself): the last low nibble */
            out[kk - k0] = kV2[p[(kk - k0) / 2] & 15], ++kk;
    } else if (op->fp4_dim == 1) {
        for (; kk < ke; ++kk)
            out[kk - k0] = kV2[(base[i * s0 + (kk / 2) * s1] >> (4 * (kk & 1))) & 15];
    } else {
        const uint8_t *p = base + (i / 2) * s0;
        const int sh = 4 * (int)(i & 1);
        for (; kk < ke; ++kk)
            out[kk - k0] = kV2[(p[kk * s1] >> sh) & 15];
    }
    for (kk = kk > k0 ? kk : k0; kk < k1; ++kk)
        out[kk - k0] = 0;
}

/* ---- panels -------------------------------------------------------------------------------- */

typedef struct f4_packed {
    int64_t mn, panels, steps, nkb;
    int gblk, spb;
    int8_t *data;  /* panels * steps * PANEL_BYTES */
    float *scale;  /* panels * nkb * 32: A 0.25 * sa, B sb */
    int32_t *bsum; /* panels * nkb * 32: B only */
} f4_packed;

static void shape_of(const dg_operand *op, int gblk, int64_t mn, f4_packed *p) {
    memset(p, 0, sizeof *p);
    p->mn = mn, p->gblk = gblk, p->spb = gblk / DG_F4_KS;
    p->steps = dg_ceil_div(op->k, DG_F4_KS), p->nkb = dg_ceil_div(op->k, gblk);
    p->panels = dg_ceil_div(mn, DG_F4_MR);
}

/* The SIMD packers take K-major FP4 rows: AVX-512 ones from AVX512_BF16 up, AVX2 ones below. */
static bool simd_rows(const dg_operand *op) {
    return DG_X86 && dg_get_isa() >= DG_ISA_AVX2 && op->fp4_dim == 1 && op->data->strides[1] == 1 && op->k % 2 == 0;
}

static bool avx512_rows(void) { return dg_get_isa() >= DG_ISA_AVX512_BF16; }

static const uint8_t *row_ptr(const dg_operand *op, int64_t i) {
    return (const uint8_t *)op->data->data + i * op->data->strides[0];
}

/* A panel p: [step][32 rows][32] (+ bias), sa4. */
static void pack_a_panel(const dg_operand *op, const f4_packed *pk, int64_t p, int bias, int8_t *dst, float *sa4) {
    const int64_t i0 = p * DG_F4_MR, rows = pk->mn - i0 < DG_F4_MR ? pk->mn - i0 : DG_F4_MR;
    const bool simd = simd_rows(op);
#if DG_X86
    if (simd)
        (avx512_rows() ? dg_f4_pack_a_avx512 : dg_f4_pack_a_avx2)(row_ptr(op, i0), op->data->strides[0], (int)rows,
                                                                 op->k / 2, pk->steps, bias, dst);
#endif
    for (int r = 0; r < DG_F4_MR; ++r) {
        const int64_t i = i0 + r;
        for (int64_t s = 0; s < pk->steps && !simd; ++s) {
            int8_t *o = dst + s * PANEL_BYTES + r * DG_F4_KS;
            if (i < pk->mn)
                fetch(op, i, s * DG_F4_KS, (s + 1) * DG_F4_KS, o);
            else
                memset(o, 0, DG_F4_KS);
            for (int q = 0; q < DG_F4_KS && bias; ++q)
                o[q] = (int8_t)(o[q] + bias);
        }
        if (i < pk->mn)
            dg_operand_scale_row(op, i, pk->gblk, pk->nkb, 0.25f, sa4 + r, DG_F4_MR);
        else
            for (int64_t kb = 0; kb < pk->nkb; ++kb)
                sa4[kb * DG_F4_MR + r] = 0.0f;
    }
}

/* B panel p: VNNI-4 [step * 8][32 cols][4], sb, bsum = -12 * block sums. stage: steps * 32 bytes. */
static void pack_b_panel(const dg_operand *op, const f4_packed *pk, int64_t p, int8_t *dst, float *sb, int32_t *bsum,
                         int8_t *stage) {
    const int64_t kp = pk->steps * DG_F4_KS, j0 = p * DG_F4_NR, rows = pk->mn - j0 < DG_F4_NR ? pk->mn - j0 : DG_F4_NR;
    /* one scale per block (the common layouts): all rows at once, block by block; per row and
     * block, dg_operand_scale_row had taken a quarter of an M = 1 call (N 7168, K 2048, Zen 4) */
    const bool direct = pk->gblk == op->gran_k;
    if (direct)
        dg_operand_block_scales_rows(op, j0, (int)rows, 0, pk->nkb, sb, DG_F4_NR);
    for (int r = 0; r < DG_F4_NR; ++r)
        if (r >= rows)
            for (int64_t kb = 0; kb < pk->nkb; ++kb)
                sb[kb * DG_F4_NR + r] = 0.0f;
        else if (!direct)
            dg_operand_scale_row(op, j0 + r, pk->gblk, pk->nkb, 1.0f, sb + r, DG_F4_NR);
#if DG_X86
    if (simd_rows(op)) { /* the next panel (a thread's next: static schedules) is fetched meanwhile */
        const int64_t j1 = j0 + DG_F4_NR, next_rows = pk->mn - j1 < DG_F4_NR ? pk->mn - j1 : DG_F4_NR;
        (avx512_rows() ? dg_f4_pack_b_avx512 : dg_f4_pack_b_avx2)(row_ptr(op, j0), op->data->strides[0], (int)rows,
                                                                 op->k / 2, pk->steps, pk->spb, dst, bsum,
                                                                 next_rows > 0 ? row_ptr(op, j1) : NULL,
                                                                 (int)next_rows);
        return;
    }
#endif
    for (int r = 0; r < DG_F4_NR; ++r) {
        const int64_t j = p * DG_F4_NR + r;
        if (j < pk->mn)
            fetch(op, j, 0, kp, stage);
        else
            memset(stage, 0, (size_t)kp);
        uint32_t *o = (uint32_t *)(void *)dst + r;
        for (int64_t g = 0; g < kp / 4; ++g)
            memcpy(o + g * DG_F4_NR, stage + 4 * g, 4);
        for (int64_t kb = 0; kb < pk->nkb; ++kb) {
            const int64_t k0 = kb * pk->gblk, k1 = k0 + pk->gblk < kp ? k0 + pk->gblk : kp;
            int32_t sum = 0;
            for (int64_t kk = k0; kk < k1; ++kk)
                sum += stage[kk];
            bsum[kb * DG_F4_NR + r] = -12 * sum;
        }
    }
}

static void packed_free(f4_packed *p) {
    dg_ws_put(p->data); /* scale and bsum live in the same block */
    p->data = NULL, p->scale = NULL, p->bsum = NULL;
}

/* All panels of op (A: is_b = 0, with bias; B: is_b = 1), in parallel. */
static dg_status pack_all(const dg_operand *op, int is_b, int bias, int gblk, f4_packed *pk) {
    shape_of(op, gblk, op->mn, pk);
    const int64_t per = pk->steps * PANEL_BYTES, sper = pk->nkb * DG_F4_MR;
    /* one pooled block (workspace.c: no fresh pages per call): panels, scales, B's sums */
    const size_t data_bytes = (size_t)dg_align(pk->panels * per, 64), sbytes = (size_t)(pk->panels * sper) * 4;
    pk->data = dg_ws_get(data_bytes + (is_b ? 2 : 1) * sbytes + 64);
    bool ok = pk->data != NULL;
    if (ok) {
        pk->scale = (float *)(void *)(pk->data + data_bytes);
        pk->bsum = is_b ? (int32_t *)(pk->scale + pk->panels * sper) : NULL;
    }
    if (ok) {
#pragma omp parallel num_threads(pk->panels < dg_num_threads() ? (int)pk->panels : dg_num_threads()) reduction(&& : ok)
        {
            int8_t *stage = is_b ? dg_malloc((size_t)per / DG_F4_NR + 64) : NULL;
            ok = !is_b || stage;
#pragma omp for schedule(static)
            for (int64_t p = 0; p < pk->panels; ++p) {
                if (!is_b)
                    pack_a_panel(op, pk, p, bias, pk->data + p * per, pk->scale + p * sper);
                else if (stage)
                    pack_b_panel(op, pk, p, pk->data + p * per, pk->scale + p * sper, pk->bsum + p * sper, stage);
            }
            dg_free(stage);
        }
    }
    if (!ok) {
        packed_free(pk);
        return dg_fail(DG_ERR_ALLOC, "out of memory packing a %lld x %lld FP4 operand", (long long)op->mn,
                       (long long)op->k);
    }
    return DG_OK;
}

/* ---- output -------------------------------------------------------------------------------- */

/* Rows [m0, m0 + rows) x columns [n0, n0 + cols) from a buffer of [mpan][npan][32][32]. */
static void store(const dg_tensor *d, const dg_tensor *c, int64_t m0, int64_t rows, int64_t n0, int64_t cols,
                  int64_t npan, const float *buf) {
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t jr = 0; jr < npan; ++jr) {
            const int64_t w = cols - jr * DG_F4_NR < DG_F4_NR ? cols - jr * DG_F4_NR : DG_F4_NR;
            const float *row = buf + ((r / DG_F4_MR) * npan + jr) * DG_F4_MR * DG_F4_NR + (r % DG_F4_MR) * DG_F4_NR;
            dg_engine_store_row(d, c, m0 + r, n0 + jr * DG_F4_NR, w, row);
        }
}

/* A panel ap against one B panel (its panel bytes, scales, sums), k steps [s0, s1) into acc. */
static inline void ukr_call(const f4_cfg *cfg, const f4_packed *pa, int64_t ap, const int8_t *bdata, const float *sb,
                            const int32_t *bsum, int64_t s0, int64_t s1, float *acc) {
    const int64_t kb0 = s0 / pa->spb, rows = pa->mn - ap * DG_F4_MR;
    cfg->ukr(s1 - s0, pa->spb, rows < DG_F4_MR ? (int)rows : DG_F4_MR,
             pa->data + (ap * pa->steps + s0) * PANEL_BYTES, bdata + s0 * PANEL_BYTES,
             pa->scale + (ap * pa->nkb + kb0) * DG_F4_MR, sb + kb0 * DG_F4_NR, bsum + kb0 * DG_F4_NR, acc);
}

/* ---- large M --------------------------------------------------------------------------------- */

typedef struct f4_job {
    const f4_cfg *cfg;
    const f4_packed *pa, *pb;
    const dg_tensor *d, *c;
    int64_t mc, nc, kcs;
} f4_job;

static void run_tile(const f4_job *j, int64_t m0, int64_t rows, int64_t n0, int64_t cols, float *buf) {
    const f4_packed *pa = j->pa, *pb = j->pb;
    const int64_t mpan = dg_ceil_div(rows, DG_F4_MR), npan = dg_ceil_div(cols, DG_F4_NR);
    const int64_t pa0 = m0 / DG_F4_MR, pb0 = n0 / DG_F4_NR, tile = DG_F4_MR * DG_F4_NR;
    memset(buf, 0, (size_t)(mpan * npan * tile) * sizeof(float));
    if (j->cfg->begin)
        j->cfg->begin();
    for (int64_t s0 = 0; s0 < pa->steps; s0 += j->kcs) {
        const int64_t s1 = s0 + j->kcs < pa->steps ? s0 + j->kcs : pa->steps;
        for (int64_t jr = 0; jr < npan; ++jr) {
            const int64_t bp = pb0 + jr, so = bp * pb->nkb * DG_F4_NR;
            for (int64_t ir = 0; ir < mpan; ++ir)
                ukr_call(j->cfg, pa, pa0 + ir, pb->data + bp * pb->steps * PANEL_BYTES, pb->scale + so,
                         pb->bsum + so, s0, s1, buf + (ir * npan + jr) * tile);
        }
    }
    store(j->d, j->c, m0, rows, n0, cols, npan, buf);
}

static dg_status run_large(const f4_cfg *cfg, const f4_packed *pa, const f4_packed *pb, const dg_tensor *d,
                           const dg_tensor *c) {
    const int threads_max = dg_num_threads();
    f4_job j = {cfg, pa, pb, d, c, cfg->mc, cfg->nc, pa->spb * (cfg->kc_steps / pa->spb > 0 ? cfg->kc_steps / pa->spb : 1)};
    while (dg_ceil_div(pa->mn, j.mc) * dg_ceil_div(pb->mn, j.nc) < 2 * threads_max) { /* balance small problems */
        if (j.nc > DG_F4_NR && j.nc >= j.mc)
            j.nc /= 2;
        else if (j.mc > DG_F4_MR)
            j.mc /= 2;
        else
            break;
    }
    const int64_t mt = dg_ceil_div(pa->mn, j.mc), nt = dg_ceil_div(pb->mn, j.nc), tiles = mt * nt;
    const int threads = (int)(tiles < threads_max ? tiles : threads_max);
    const int64_t per = j.mc * j.nc;
    float *mem = dg_ws_get((size_t)(threads * per) * sizeof(float));
    DG_CHECK(mem != NULL, DG_ERR_ALLOC, "out of memory for the FP4 GEMM tile buffers");
#pragma omp parallel num_threads(threads)
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < tiles; ++t) {
            const int64_t m0 = (t % mt) * j.mc, n0 = (t / mt) * j.nc;
            run_tile(&j, m0, pa->mn - m0 < j.mc ? pa->mn - m0 : j.mc, n0, pb->mn - n0 < j.nc ? pb->mn - n0 : j.nc,
                     mem + tid * per);
        }
    }
    dg_ws_put(mem);
    return DG_OK;
}

/* ---- small M --------------------------------------------------------------------------------- */

/* Asks for B panel p's scales (the thread's next panel: static schedule) while this one
 * computes; the SIMD packers fetch its rows as they pack this one (K-major rows are all they
 * take), and the others get the rows here. Prefetching a whole panel's rows here, at once,
 * held the L1 miss buffers: an M = 1 call (N 7168, K 2048, Zen 4) read B at a quarter of DRAM
 * speed. */
static void prefetch_panel(const dg_operand *b, int64_t p) {
    const dg_tensor *t = b->data;
    if (b->fp4_dim != 1 || t->strides[1] != 1)
        return;
    const int64_t row_bytes = simd_rows(b) ? 0 : b->k / 2; /* the rows this call fetches */
    for (int64_t j = p * DG_F4_NR; j < (p + 1) * DG_F4_NR && j < b->mn; ++j) {
        const char *row = (const char *)t->data + j * t->strides[0];
        for (int64_t off = 0; off < row_bytes; off += 64)
            __builtin_prefetch(row + off, 0, 2);
        if (b->sf->strides[1] == 1) {
            const char *srow = (const char *)b->sf->data + (j / b->gran_mn) * b->sf->strides[0] * 4;
            const int64_t sbytes = 4 * dg_ceil_div(b->k, b->gran_k * (b->sf_packed ? 4 : 1));
            for (int64_t off = 0; off < sbytes; off += 64)
                __builtin_prefetch(srow + off, 0, 2);
        }
    }
}

static dg_status run_small(const f4_cfg *cfg, const f4_packed *pa, const dg_operand *b, const dg_tensor *d,
                           const dg_tensor *c) {
    f4_packed pb;
    shape_of(b, pa->gblk, b->mn, &pb);
    const int64_t bytes = pb.steps * PANEL_BYTES, sper = pb.nkb * DG_F4_NR, tile = DG_F4_MR * DG_F4_NR;
    const int threads = (int)(pb.panels < dg_num_threads() ? pb.panels : dg_num_threads());
    /* per thread: B panel, its scales and sums, the decode row, the float tiles of all A panels */
    const int64_t per = dg_align(bytes + 64, 64) + dg_align(2 * sper * 4 + pb.steps * DG_F4_KS + 64, 64) +
                        pa->panels * tile * 4;
    char *mem = dg_ws_get((size_t)(threads * per)); /* pooled: no fresh pages per call */
    DG_CHECK(mem != NULL, DG_ERR_ALLOC, "out of memory for the FP4 GEMM panel buffers");
#pragma omp parallel num_threads(threads)
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        char *base = mem + tid * per;
        int8_t *bdata = (int8_t *)base;
        float *sb = (float *)(void *)(base + dg_align(bytes + 64, 64));
        int32_t *bsum = (int32_t *)(sb + sper);
        int8_t *stage = (int8_t *)(bsum + sper);
        float *acc = (float *)(void *)(base + dg_align(bytes + 64, 64) + dg_align(2 * sper * 4 + pb.steps * DG_F4_KS + 64, 64));
#pragma omp for schedule(static)
        for (int64_t p = 0; p < pb.panels; ++p) {
            pack_b_panel(b, &pb, p, bdata, sb, bsum, stage);
            prefetch_panel(b, p + 1);
            memset(acc, 0, (size_t)(pa->panels * tile) * sizeof(float));
            if (cfg->begin)
                cfg->begin();
            for (int64_t ap = 0; ap < pa->panels; ++ap)
                ukr_call(cfg, pa, ap, bdata, sb, bsum, 0, pa->steps, acc + ap * tile);
            const int64_t n0 = p * DG_F4_NR;
            for (int64_t ap = 0; ap < pa->panels; ++ap) {
                const int64_t rows = pa->mn - ap * DG_F4_MR < DG_F4_MR ? pa->mn - ap * DG_F4_MR : DG_F4_MR;
                store(d, c, ap * DG_F4_MR, rows, n0, b->mn - n0 < DG_F4_NR ? b->mn - n0 : DG_F4_NR, 1, acc + ap * tile);
            }
        }
    }
    dg_ws_put(mem);
    return DG_OK;
}

dg_status dg_engine_gemm_fp4x4(const dg_operand *a, const dg_operand *b, const dg_tensor *d, const dg_tensor *c) {
    pthread_once(&g_once, init_pair);
    const f4_cfg cfg = config_now(a->mn);
    const int gblk = gcd(a->gran_k, b->gran_k);
    DG_PATH("fp4 x fp4 integer kernel, %s, %s-M (exact block dot products) | first: m=%lld n=%lld k=%lld", cfg.name,
            a->mn <= SMALL_M ? "small" : "large", (long long)a->mn, (long long)b->mn, (long long)a->k);
    f4_packed pa, pb;
    DG_TRY(pack_all(a, 0, cfg.a_bias, gblk, &pa));
    dg_status st;
    if (a->mn <= SMALL_M) {
        st = run_small(&cfg, &pa, b, d, c);
    } else {
        st = pack_all(b, 1, 0, gblk, &pb);
        if (st == DG_OK) {
            st = run_large(&cfg, &pa, &pb, d, c);
            packed_free(&pb);
        }
    }
    packed_free(&pa);
    return st;
}
