/*
 * fuzz_gemm_dense.c - libFuzzer harness over the dense GEMMs' argument checking: BF16 and
 * FP8/FP4 nt/nn/tn/tt, skip_head_mid, and pre-packed B (dg_pack_b and the _nt_packed calls).
 * See fuzz_common.h for how tensors are built from the input.
 */
#include "fuzz_common.h"

/* D (and C: none, D itself, or its own tensor) [M, N] */
static void fz_dc(fz_ctx *c, dg_tensor *d, dg_tensor *cc, dg_tensor **dp, dg_tensor **cp) {
    static const int mn[2] = {0, 1};
    dg_dtype dt = (fz_u8(&c->r) & 1) ? DG_FLOAT32 : DG_BFLOAT16;
    *dp = fz_tensor(c, d, dt, 2, mn, FZ_FILL_FLOAT);
    uint8_t m = fz_u8(&c->r);
    *cp = m < 128 ? NULL : m < 192 ? *dp : fz_tensor(c, cc, dt, 2, mn, FZ_FILL_FLOAT);
}

/* an FP8 or FP4 operand [rows, K] or transposed, with its scales */
static void fz_quant_operand(fz_ctx *c, dg_tensor *x, dg_tensor *sf, dg_tensor **xp, dg_tensor **sfp, int mn_slot,
                             int k_major) {
    int s[2] = {k_major ? mn_slot : 2, k_major ? 2 : mn_slot};
    uint8_t m = fz_u8(&c->r);
    dg_dtype dt = (m & 1) ? DG_FP4_E2M1X2 : DG_FLOAT8_E4M3;
    *xp = fz_tensor(c, x, dt, 2, s, FZ_FILL_FLOAT);
    int ss[2] = {k_major ? mn_slot : 4, k_major ? 4 : mn_slot};
    *sfp = fz_tensor(c, sf, (m & 2) ? DG_INT32 : DG_FLOAT32, 2, ss, FZ_FILL_FLOAT);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_ctx c;
    fz_init(&c, data, size);
    fz_settings(&c);
    uint8_t sel = fz_u8(&c.r) % 14;
    dg_tensor a, b, d, cc, sfa, sfb;
    dg_tensor *ap, *bp, *dp, *cp, *sfap = NULL, *sfbp = NULL;
    dg_gemm_options o;
    const dg_gemm_options *op;
    dg_status st = DG_OK;
    const char *fn = "?";
    int ta = 0, tb = 0; /* A as [K, M], B as [K, N] */
    if (sel < 4 || (sel >= 4 && sel < 8)) {
        int form = sel % 4; /* nt nn tn tt */
        ta = form == 2 || form == 3;
        tb = form == 1 || form == 2;
    }
    if (sel < 4) {
        int sa[2] = {ta ? 2 : 0, ta ? 0 : 2}, sb[2] = {tb ? 2 : 1, tb ? 1 : 2};
        ap = fz_tensor(&c, &a, DG_BFLOAT16, 2, sa, FZ_FILL_FLOAT);
        bp = fz_tensor(&c, &b, DG_BFLOAT16, 2, sb, FZ_FILL_FLOAT);
        fz_dc(&c, &d, &cc, &dp, &cp);
        if (c.skip)
            goto out;
        fz_output(&c, dp);
        static dg_status (*const f[4])(const dg_tensor *, const dg_tensor *, const dg_tensor *, const dg_tensor *) = {
            dg_bf16_gemm_nt, dg_bf16_gemm_nn, dg_bf16_gemm_tn, dg_bf16_gemm_tt};
        fn = "dg_bf16_gemm";
        st = f[sel](ap, bp, dp, cp);
    } else if (sel < 8) {
        fz_quant_operand(&c, &a, &sfa, &ap, &sfap, 0, !ta);
        fz_quant_operand(&c, &b, &sfb, &bp, &sfbp, 1, !tb);
        fz_dc(&c, &d, &cc, &dp, &cp);
        op = fz_options(&c, &o);
        if (c.skip)
            goto out;
        fz_output(&c, dp);
        static dg_status (*const f[4])(const dg_tensor *, const dg_tensor *, const dg_tensor *, const dg_tensor *,
                                       const dg_tensor *, const dg_tensor *, const dg_gemm_options *) = {
            dg_fp8_fp4_gemm_nt, dg_fp8_fp4_gemm_nn, dg_fp8_fp4_gemm_tn, dg_fp8_fp4_gemm_tt};
        fn = "dg_fp8_fp4_gemm";
        st = f[sel - 4](ap, sfap, bp, sfbp, dp, cp, op);
    } else if (sel < 10) {
        /* skip_head_mid: B [heads * (left + right), K], D [M, heads * (left + mid + right)] */
        int hs[3] = {fz_int(&c.r), fz_int(&c.r), fz_int(&c.r)};
        fz_quant_operand(&c, &a, &sfa, &ap, &sfap, 0, 1);
        fz_quant_operand(&c, &b, &sfb, &bp, &sfbp, 1, 1);
        fz_dc(&c, &d, &cc, &dp, &cp);
        op = fz_options(&c, &o);
        if (c.skip)
            goto out;
        fz_output(&c, dp);
        fn = "dg_fp8_gemm_nt_skip_head_mid";
        st = dg_fp8_gemm_nt_skip_head_mid(ap, sfap, bp, sfbp, dp, (fz_u8(&c.r) & 1) ? NULL : hs, op);
    } else {
        /* pre-packed B, then a GEMM taking it */
        int bf16 = sel < 12;
        static const int sb[2] = {1, 2};
        if (bf16) {
            bp = fz_tensor(&c, &b, DG_BFLOAT16, 2, sb, FZ_FILL_FLOAT);
            sfbp = (fz_u8(&c.r) & 3) == 0 ? fz_tensor(&c, &sfb, DG_FLOAT32, 2, sb, FZ_FILL_FLOAT) : NULL;
        } else {
            fz_quant_operand(&c, &b, &sfb, &bp, &sfbp, 1, !(fz_u8(&c.r) & 1));
        }
        op = fz_options(&c, &o);
        dg_gemm_options o2;
        const dg_gemm_options *op2 = fz_options(&c, &o2);
        static const int sa[2] = {0, 2};
        if (bf16) {
            ap = fz_tensor(&c, &a, DG_BFLOAT16, 2, sa, FZ_FILL_FLOAT);
        } else {
            fz_quant_operand(&c, &a, &sfa, &ap, &sfap, 0, 1);
        }
        fz_dc(&c, &d, &cc, &dp, &cp);
        if (c.skip)
            goto out;
        dg_packed_b *pb = NULL;
        fn = "dg_pack_b";
        st = dg_pack_b(bp, sfbp, op, (fz_u8(&c.r) == 255) ? NULL : &pb);
        if (st != DG_OK) {
            if (pb) {
                fprintf(stderr, "dg_pack_b failed but returned an object\n");
                abort();
            }
            goto out;
        }
        fz_output(&c, dp);
        if (bf16) {
            fn = "dg_bf16_gemm_nt_packed";
            st = dg_bf16_gemm_nt_packed(ap, pb, dp, cp);
        } else {
            fn = "dg_fp8_fp4_gemm_nt_packed";
            st = dg_fp8_fp4_gemm_nt_packed(ap, sfap, pb, dp, cp, op2);
        }
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
