/*
 * fuzz_gemm_grouped.c - libFuzzer harness over the grouped GEMMs' argument checking:
 * m-grouped contiguous (index and psum layouts) and masked, BF16 and FP8/FP4, k-grouped
 * (tn/nt, FP8 and BF16), and pre-packed grouped B. Index tensors (grouped_layout, masked_m)
 * and ks hold small integers from the input. See fuzz_common.h.
 */
#include "fuzz_common.h"

/* vocabulary slots: 0 M (or max_m), 1 N, 2 K, 3 G, 4 scale columns, 5 misc */

static void fz_qop(fz_ctx *c, dg_tensor *x, dg_tensor *sf, dg_tensor **xp, dg_tensor **sfp, int nd, const int *s,
                   const int *ss) {
    uint8_t m = fz_u8(&c->r);
    *xp = fz_tensor(c, x, (m & 1) ? DG_FP4_E2M1X2 : DG_FLOAT8_E4M3, nd, s, FZ_FILL_FLOAT);
    *sfp = fz_tensor(c, sf, (m & 2) ? DG_INT32 : DG_FLOAT32, nd, ss, FZ_FILL_FLOAT);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_ctx c;
    fz_init(&c, data, size);
    fz_settings(&c);
    uint8_t sel = fz_u8(&c.r) % 14;
    dg_tensor a, b, d, cc, sfa, sfb, lay;
    dg_tensor *ap = NULL, *bp = NULL, *dp, *cp = NULL, *sfap = NULL, *sfbp = NULL, *lp;
    dg_gemm_options o;
    const dg_gemm_options *op = fz_options(&c, &o);
    dg_status st = DG_OK;
    const char *fn = "?";
    dg_dtype ddt = (fz_u8(&c.r) & 1) ? DG_FLOAT32 : DG_BFLOAT16;
    if (sel < 6) { /* m-grouped contiguous: bf16 nt/nn, fp8 nt/nn (twice: fp8_fp4 and fp8 names) */
        int nn = sel & 1;
        static const int sa[2] = {0, 2}, ssa[2] = {0, 4}, sd[2] = {0, 1};
        int sb[3] = {3, nn ? 2 : 1, nn ? 1 : 2}, ssb[3] = {3, nn ? 4 : 1, nn ? 1 : 4};
        if (sel < 2) {
            ap = fz_tensor(&c, &a, DG_BFLOAT16, 2, sa, FZ_FILL_FLOAT);
            bp = fz_tensor(&c, &b, DG_BFLOAT16, 3, sb, FZ_FILL_FLOAT);
        } else {
            fz_qop(&c, &a, &sfa, &ap, &sfap, 2, sa, ssa);
            fz_qop(&c, &b, &sfb, &bp, &sfbp, 3, sb, ssb);
        }
        dp = fz_tensor(&c, &d, ddt, 2, sd, FZ_FILL_FLOAT);
        static const int sl[1] = {0}, slg[1] = {3};
        lp = fz_tensor(&c, &lay, DG_INT32, 1, (op && op->use_psum_layout) ? slg : sl, FZ_FILL_INDEX);
        if (c.skip)
            goto out;
        fz_output(&c, dp);
        fn = "dg_m_grouped_*_contiguous";
        switch (sel) {
        case 0: st = dg_m_grouped_bf16_gemm_nt_contiguous(ap, bp, dp, lp, op); break;
        case 1: st = dg_m_grouped_bf16_gemm_nn_contiguous(ap, bp, dp, lp, op); break;
        case 2: st = dg_m_grouped_fp8_fp4_gemm_nt_contiguous(ap, sfap, bp, sfbp, dp, lp, op); break;
        case 3: st = dg_m_grouped_fp8_fp4_gemm_nn_contiguous(ap, sfap, bp, sfbp, dp, lp, op); break;
        case 4: st = dg_m_grouped_fp8_gemm_nt_contiguous(ap, sfap, bp, sfbp, dp, lp, op); break;
        default: st = dg_m_grouped_fp8_gemm_nn_contiguous(ap, sfap, bp, sfbp, dp, lp, op); break;
        }
    } else if (sel < 9) { /* masked */
        static const int sa[3] = {3, 0, 2}, ssa[3] = {3, 0, 4}, sb[3] = {3, 1, 2}, ssb[3] = {3, 1, 4},
                         sd[3] = {3, 0, 1}, sm[1] = {3};
        if (sel == 6) {
            ap = fz_tensor(&c, &a, DG_BFLOAT16, 3, sa, FZ_FILL_FLOAT);
            bp = fz_tensor(&c, &b, DG_BFLOAT16, 3, sb, FZ_FILL_FLOAT);
        } else {
            fz_qop(&c, &a, &sfa, &ap, &sfap, 3, sa, ssa);
            fz_qop(&c, &b, &sfb, &bp, &sfbp, 3, sb, ssb);
        }
        dp = fz_tensor(&c, &d, ddt, 3, sd, FZ_FILL_FLOAT);
        lp = fz_tensor(&c, &lay, DG_INT32, 1, sm, FZ_FILL_INDEX);
        int expected_m = fz_int(&c.r);
        if (c.skip)
            goto out;
        fz_output(&c, dp);
        fn = "dg_m_grouped_*_masked";
        if (sel == 6)
            st = dg_m_grouped_bf16_gemm_nt_masked(ap, bp, dp, lp, expected_m, op);
        else if (sel == 7)
            st = dg_m_grouped_fp8_fp4_gemm_nt_masked(ap, sfap, bp, sfbp, dp, lp, expected_m, op);
        else
            st = dg_m_grouped_fp8_gemm_nt_masked(ap, sfap, bp, sfbp, dp, lp, expected_m, op);
    } else if (sel < 12) { /* k-grouped: a [sum_k, M], b [sum_k, N] (tn) or flat (nt); d [G, M, N] */
        int ks[8], nks = fz_u8(&c.r) % 9;
        for (int i = 0; i < nks; ++i) {
            uint8_t v = fz_u8(&c.r);
            ks[i] = v < 200 ? (v % 5) * 32 * (1 + (v & 4)) : fz_int(&c.r);
        }
        static const int sa[2] = {2, 0}, sb[2] = {2, 1}, ssa[2] = {4, 0}, ssb[2] = {4, 1}, sd[3] = {3, 0, 1},
                         sl[1] = {3};
        if (sel == 11) {
            ap = fz_tensor(&c, &a, DG_BFLOAT16, 2, sa, FZ_FILL_FLOAT);
            bp = fz_tensor(&c, &b, DG_BFLOAT16, 2, sb, FZ_FILL_FLOAT);
        } else if (sel == 9) {
            fz_qop(&c, &a, &sfa, &ap, &sfap, 2, sa, ssa);
            fz_qop(&c, &b, &sfb, &bp, &sfbp, 2, sb, ssb);
        } else { /* nt: flat a/b, sfa [M, sum_k/128] */
            static const int fa[1] = {2}, fsa[2] = {0, 4}, fsb[2] = {1, 4};
            fz_qop(&c, &a, &sfa, &ap, &sfap, 1, fa, fsa);
            fz_qop(&c, &b, &sfb, &bp, &sfbp, 1, fa, fsb);
        }
        dp = fz_tensor(&c, &d, DG_FLOAT32, 3, sd, FZ_FILL_FLOAT);
        uint8_t cm = fz_u8(&c.r);
        cp = cm < 128 ? dp : cm < 192 ? NULL : fz_tensor(&c, &cc, DG_FLOAT32, 3, sd, FZ_FILL_FLOAT);
        lp = fz_tensor(&c, &lay, DG_INT32, 1, sl, FZ_FILL_INDEX);
        const int *ksp = (fz_u8(&c.r) & 7) ? ks : NULL;
        if (c.skip)
            goto out;
        fz_output(&c, dp);
        fn = "dg_k_grouped_*";
        if (sel == 9)
            st = dg_k_grouped_fp8_gemm_tn_contiguous(ap, sfap, bp, sfbp, dp, ksp, nks, lp, cp, op);
        else if (sel == 10)
            st = dg_k_grouped_fp8_gemm_nt_contiguous(ap, sfap, bp, sfbp, dp, ksp, nks, lp, cp, op);
        else
            st = dg_k_grouped_bf16_gemm_tn_contiguous(ap, bp, dp, ksp, nks, lp, cp, op);
    } else { /* pre-packed grouped B, then a masked or contiguous call */
        int bf16 = sel == 12;
        static const int sb[3] = {3, 1, 2}, ssb[3] = {3, 1, 4};
        if (bf16)
            bp = fz_tensor(&c, &b, DG_BFLOAT16, 3, sb, FZ_FILL_FLOAT);
        else
            fz_qop(&c, &b, &sfb, &bp, &sfbp, 3, sb, ssb);
        int masked = fz_u8(&c.r) & 1;
        static const int ma[3] = {3, 0, 2}, msa[3] = {3, 0, 4}, md[3] = {3, 0, 1}, ml[1] = {3};
        static const int ca[2] = {0, 2}, csa[2] = {0, 4}, cd[2] = {0, 1}, cl[1] = {0};
        if (bf16)
            ap = fz_tensor(&c, &a, DG_BFLOAT16, masked ? 3 : 2, masked ? ma : ca, FZ_FILL_FLOAT);
        else
            fz_qop(&c, &a, &sfa, &ap, &sfap, masked ? 3 : 2, masked ? ma : ca, masked ? msa : csa);
        dp = fz_tensor(&c, &d, ddt, masked ? 3 : 2, masked ? md : cd, FZ_FILL_FLOAT);
        lp = fz_tensor(&c, &lay, DG_INT32, 1, masked ? ml : cl, FZ_FILL_INDEX);
        int expected_m = fz_int(&c.r);
        dg_gemm_options o2;
        const dg_gemm_options *op2 = fz_options(&c, &o2);
        if (c.skip)
            goto out;
        dg_packed_b *pb = NULL;
        fn = "dg_pack_b_grouped";
        st = dg_pack_b_grouped(bp, sfbp, op, &pb);
        if (st != DG_OK)
            goto out;
        fz_output(&c, dp);
        fn = "dg_m_grouped_*_packed";
        if (masked)
            st = bf16 ? dg_m_grouped_bf16_gemm_nt_masked_packed(ap, pb, dp, lp, expected_m, op2)
                      : dg_m_grouped_fp8_fp4_gemm_nt_masked_packed(ap, sfap, pb, dp, lp, expected_m, op2);
        else
            st = bf16 ? dg_m_grouped_bf16_gemm_nt_contiguous_packed(ap, pb, dp, lp, op2)
                      : dg_m_grouped_fp8_fp4_gemm_nt_contiguous_packed(ap, sfap, pb, dp, lp, op2);
        dg_packed_b_free(pb);
    }
out:
    if (c.skip) {
        fz_finish(&c, DG_OK, fn);
        return -1;
    }
    fz_finish(&c, st, fn);
    return 0;
}
