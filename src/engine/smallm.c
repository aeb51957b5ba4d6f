/*
 * smallm.c - the engine's small-M path (decoding: M <= 64), bound by reading B once.
 *
 * B is never packed as a whole: each thread takes blocks of NR columns and, for each K slice,
 * transposes that NR x slice piece of B from memory into a float32 L1/L2 buffer (the ISA's
 * BF16 packer; BF16 K-major B is read in place, other dtypes/layouts are widened to BF16 rows
 * first), then runs the microkernel over the few A panels (MR = 1, 2, 4 or 8 rows, the same
 * kernel body instantiated per MR), with the per-K-block scale epilogue when scales are not
 * folded. Per output element the operations are exactly the large-M path's (engine.h: one
 * fma chain over k pairs, odd k first, blocks combined in order), so a row of D does not
 * depend on M or on which path ran it (batch invariance).
 *
 * Applies on ISAs with a BF16 packer and small-M kernels (AVX-512 levels); elsewhere small M
 * takes the general path.
 */
#include "engine.h"

#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#define SMALL_M_MAX 64
#define SMALL_KC 128 /* NR x slice float32 B piece: 32 x 128 x 4 = 16 KiB, stays in L1 */

bool dg_engine_small_applies(const dg_engine_cfg *cfg, const dg_operand *a, const dg_operand *b) {
    return a->mn <= SMALL_M_MAX && cfg->pack_bf16 && cfg->ukr_small[0];
}

typedef struct small_job {
    const dg_engine_cfg *cfg;
    const dg_operand *b;
    const dg_scale_plan *plan;
    const dg_packed *pa;
    dg_ukr_fn ukr;
    int mr;
    int64_t slice;   /* K slice: SMALL_KC, a multiple of the scale block */
    const float *ones;
} small_job;

/* B rows [n0, n0 + cols), k in [k0, k0 + kc), as a float32 NR-wide panel slice in bbuf. */
static void stage_b(const small_job *j, int64_t n0, int64_t cols, int64_t k0, int64_t kc, uint16_t *stage,
                    float *bbuf) {
    const dg_operand *b = j->b;
    const int nr = j->cfg->nr;
    const dg_tensor *t = b->data;
    if (t->dtype == DG_BFLOAT16 && t->strides[1] == 1) { /* read in place */
        j->cfg->pack_bf16((const uint16_t *)t->data + n0 * t->strides[0], t->strides[0], cols, nr, k0, kc, b->k,
                          DG_PACK_F32, bbuf);
        return;
    }
    if (t->dtype == DG_BFLOAT16 && t->strides[0] == 1 && j->cfg->pack_bf16_mn) { /* MN-major, in place */
        j->cfg->pack_bf16_mn((const uint16_t *)t->data + n0, t->strides[1], cols, nr, k0, kc, b->k, DG_PACK_F32,
                             bbuf);
        return;
    }
    for (int r = 0; r < nr; ++r) {
        if (r < cols)
            dg_engine_fetch_bf16(b, n0 + r, j->plan->fold_b, k0, k0 + kc, stage + r * kc, j->cfg);
        else
            memset(stage + r * kc, 0, (size_t)kc * 2);
    }
    j->cfg->pack_bf16(stage, kc, nr, nr, 0, kc, kc, DG_PACK_F32, bbuf);
}

/* One NR-column block of D: every K slice, then the store. */
static void run_block(const small_job *j, int64_t n0, int64_t cols, uint16_t *stage, float *bbuf, float *cbuf,
                      float *sb) {
    const dg_packed *pa = j->pa;
    const int nr = j->cfg->nr, mr = j->mr, gblk = j->plan->gblk;
    const int64_t kp = pa->kp;
    if (gblk || kp == 0)
        memset(cbuf, 0, (size_t)(pa->panels * mr * nr) * sizeof(float));
    for (int64_t k0 = 0; k0 < kp; k0 += j->slice) {
        const int64_t kc = kp - k0 < j->slice ? kp - k0 : j->slice;
        stage_b(j, n0, cols, k0, kc, stage, bbuf);
        for (int64_t ir = 0; ir < pa->panels; ++ir) {
            const float *ap = (const float *)pa->data + ir * kp * mr;
            if (!gblk) {
                j->ukr(kc, ap + k0 * mr, bbuf, cbuf + ir * mr * nr, nr, k0 == 0 ? DG_UKR_ZERO : DG_UKR_ACC, NULL,
                       NULL);
                continue;
            }
            for (int64_t kb0 = k0; kb0 < k0 + kc; kb0 += gblk) { /* one scale epilogue per block */
                const int64_t kb1 = kb0 + gblk < k0 + kc ? kb0 + gblk : k0 + kc;
                const float *sbp = j->ones;
                if (!j->plan->fold_b && j->b->sf) {
                    for (int s = 0; s < nr; ++s)
                        sb[s] = s < cols ? dg_operand_scale(j->b, 0, n0 + s, kb0) : 1.0f;
                    sbp = sb;
                }
                const float *sap = pa->scales ? pa->scales + (ir * pa->nkb + kb0 / gblk) * mr : j->ones;
                j->ukr(kb1 - kb0, ap + kb0 * mr, bbuf + (kb0 - k0) * nr, cbuf + ir * mr * nr, nr, DG_UKR_SCALE,
                       sap, sbp);
            }
        }
    }
}

dg_status dg_engine_gemm_small(const dg_engine_cfg *cfg, const dg_operand *a, const dg_operand *b,
                               const dg_scale_plan *plan, const dg_tensor *d, const dg_tensor *c) {
    static const int kMr[4] = {1, 2, 4, 8};
    int which = 3;
    while (which > 0 && kMr[which - 1] >= a->mn)
        --which;
    small_job j = {cfg, b, plan, NULL, cfg->ukr_small[which], kMr[which], SMALL_KC, NULL};
    if (plan->gblk)
        j.slice = plan->gblk * (SMALL_KC / plan->gblk > 0 ? SMALL_KC / plan->gblk : 1);
    dg_packed pa;
    DG_TRY(dg_engine_pack(a, plan->fold_a, plan->gblk, DG_PACK_F32, j.mr, cfg, &pa));
    j.pa = &pa;

    const int nr = cfg->nr;
    const int64_t n = b->mn, blocks = dg_ceil_div(n, nr), mpad = pa.panels * j.mr;
    const int threads = (int)(blocks < dg_num_threads() ? blocks : dg_num_threads());
    /* Every thread's buffers up front (floats): B slice, accumulators, ones, B scales, then the
     * BF16 staging rows; a failure returns before anything is written. */
    const int64_t per_thread = dg_align(j.slice * nr + mpad * nr + 2 * (nr + 8) + (j.slice * nr + 1) / 2, 16);
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
        float *sbuf = ones + nr + 8;
        uint16_t *stage = (uint16_t *)(sbuf + nr + 8);
        small_job jt = j;
        for (int s = 0; s < nr + 8; ++s)
            ones[s] = 1.0f;
        jt.ones = ones;
#pragma omp for schedule(dynamic, 4) /* any block order: each block's result is fixed */
        for (int64_t jb = 0; jb < blocks; ++jb) {
            const int64_t n0 = jb * nr, cols = n - n0 < nr ? n - n0 : nr;
            run_block(&jt, n0, cols, stage, bbuf, cbuf, sbuf);
            for (int64_t i = 0; i < a->mn; ++i)
                dg_engine_store_row(d, c, i, n0, cols, cbuf + i * nr);
        }
    }
    dg_free(mem);
    dg_engine_packed_free(&pa);
    return DG_OK;
}
