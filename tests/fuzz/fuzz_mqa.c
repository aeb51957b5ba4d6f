/*
 * fuzz_mqa.c - libFuzzer harness over the MQA logits' argument checking: dg_fp8_mqa_logits,
 * dg_fp8_fp4_mqa_logits (ks/ke ranges, compressed logits, query form), the paged metadata and
 * dg_fp8(_fp4)_paged_mqa_logits (context lengths, block tables, schedule); q and kv FP8, MXFP4 or
 * MXFP8 (E4M3 with q_sf and INT32 kv scales). See fuzz_common.h.
 */
#include "fuzz_common.h"

/* vocabulary slots: 0 S or B, 1 SK or num_blocks, 2 D, 3 H, 4 next_n or block_kv, 5 misc */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_ctx c;
    fz_init(&c, data, size);
    fz_settings(&c);
    uint8_t sel = fz_u8(&c.r) % 5;
    dg_tensor q, qsf, kv, kvsf, w, ks, ke, lg, cl, bt, sm, idx;
    dg_tensor *qp, *qsfp = NULL, *kvp, *kvsfp, *wp, *ksp, *kep, *lgp, *clp, *btp, *smp, *idxp;
    dg_status st = DG_OK;
    const char *fn = "?";
    dg_dtype ldt = (fz_u8(&c.r) & 1) ? DG_BFLOAT16 : DG_FLOAT32;
    int clean = fz_u8(&c.r) % 3 == 0 ? fz_int(&c.r) : (int)(fz_u8(&c.r) & 1);
    if (sel < 2) {
        const uint8_t fb = sel == 1 ? fz_u8(&c.r) : 0;
        const int fp4 = fb & 1, mx = fp4 || (fb & 2); /* mx without fp4: MXFP8 */
        static const int sq[3] = {0, 3, 2}, sqsf[2] = {0, 3}, skv[2] = {1, 2}, skvsf[1] = {1}, sw[2] = {0, 3},
                         sks[1] = {0}, slg[2] = {0, 1};
        qp = fz_tensor(&c, &q, fp4 ? DG_FP4_E2M1X2 : DG_FLOAT8_E4M3, 3, sq, FZ_FILL_FLOAT);
        if (mx)
            qsfp = fz_tensor(&c, &qsf, DG_INT32, 2, sqsf, FZ_FILL_FLOAT);
        kvp = fz_tensor(&c, &kv, fp4 ? DG_FP4_E2M1X2 : DG_FLOAT8_E4M3, 2, skv, FZ_FILL_FLOAT);
        kvsfp = fz_tensor(&c, &kvsf, mx ? DG_INT32 : DG_FLOAT32, 1, skvsf, FZ_FILL_FLOAT);
        wp = fz_tensor(&c, &w, ldt == DG_BFLOAT16 && (fz_u8(&c.r) & 1) ? DG_BFLOAT16 : DG_FLOAT32, 2, sw,
                       FZ_FILL_FLOAT);
        ksp = fz_tensor(&c, &ks, DG_INT32, 1, sks, FZ_FILL_INDEX);
        kep = fz_tensor(&c, &ke, DG_INT32, 1, sks, FZ_FILL_INDEX);
        int max_seqlen_k = (fz_u8(&c.r) & 3) ? 0 : fz_int(&c.r);
        lgp = fz_tensor(&c, &lg, ldt, 2, slg, FZ_FILL_FLOAT);
        if (lgp && (fz_u8(&c.r) & 3) == 0) { /* query form */
            lg.data = NULL;
        }
        if (c.skip)
            goto out;
        fz_output(&c, lgp);
        if (sel == 0) {
            fn = "dg_fp8_mqa_logits";
            st = dg_fp8_mqa_logits(qp, kvp, kvsfp, wp, ksp, kep, clean, max_seqlen_k, lgp);
        } else {
            fn = "dg_fp8_fp4_mqa_logits";
            st = dg_fp8_fp4_mqa_logits(qp, qsfp, kvp, kvsfp, wp, ksp, kep, clean, max_seqlen_k, lgp);
        }
        if (st == DG_OK && lgp && !lgp->data && fz_answer(&c, lgp)) { /* the query form's answer works */
            if (sel == 0)
                st = dg_fp8_mqa_logits(qp, kvp, kvsfp, wp, ksp, kep, clean, max_seqlen_k, lgp);
            else
                st = dg_fp8_fp4_mqa_logits(qp, qsfp, kvp, kvsfp, wp, ksp, kep, clean, max_seqlen_k, lgp);
            fz_expect_ok(st, fn);
        }
    } else {
        /* context_lens [B, next_n] or [B]; indices optional; schedule from the metadata call */
        int two_d = fz_u8(&c.r) & 1;
        static const int scl2[2] = {0, 4}, scl1[1] = {0};
        clp = fz_tensor(&c, &cl, DG_INT32, two_d ? 2 : 1, two_d ? scl2 : scl1, FZ_FILL_INDEX);
        idxp = (fz_u8(&c.r) & 3) == 0 ? fz_tensor(&c, &idx, DG_INT32, 1, scl1, FZ_FILL_INDEX) : NULL;
        int block_kv = (fz_u8(&c.r) & 1) ? 64 : fz_int(&c.r);
        int num_sms = (fz_u8(&c.r) & 3) ? dg_get_num_sms() : fz_int(&c.r);
        int64_t smshape[2] = {(int64_t)num_sms + 1, 2};
        sm = dg_tensor_make(NULL, DG_INT32, 2, smshape);
        smp = &sm;
        if (c.skip)
            goto out;
        if (sel == 2 || (fz_u8(&c.r) & 7) == 0) { /* metadata only, sometimes with a fuzzed schedule */
            static const int ssm[2] = {5, -1};
            smp = fz_tensor(&c, &sm, DG_INT32, 2, ssm, FZ_FILL_INDEX);
            if (c.skip)
                goto out;
            fz_output(&c, smp);
            fn = "dg_get_paged_mqa_logits_metadata";
            st = dg_get_paged_mqa_logits_metadata(clp, block_kv, num_sms, idxp, smp);
            goto out;
        }
        /* the real schedule: query, then fill */
        fn = "dg_get_paged_mqa_logits_metadata";
        st = dg_get_paged_mqa_logits_metadata(clp, block_kv, num_sms, idxp, &sm);
        if (st != DG_OK)
            goto out;
        size_t nb = dg_tensor_nbytes(&sm);
        if (nb > FZ_MAX_SPAN) {
            c.skip = 1;
            goto out;
        }
        sm.data = malloc(nb ? nb : 1);
        st = dg_get_paged_mqa_logits_metadata(clp, block_kv, num_sms, idxp, &sm);
        if (st != DG_OK) {
            fprintf(stderr, "metadata: query form answered, but the call with its answer failed: %s\n",
                    dg_last_error());
            abort();
        }
        const uint8_t fb = sel == 4 ? fz_u8(&c.r) : 0;
        const int fp4 = fb & 1, mx = fp4 || (fb & 2); /* mx without fp4: MXFP8 */
        /* q [B, next_n, H, D], kv_cache UINT8 [num_blocks, block_kv, 1, D + 4] */
        static const int sq[4] = {0, 4, 3, 2}, sqsf[3] = {0, 4, 3}, skc[4] = {1, 5, -1, 2}, sw[2] = {0, 3},
                         sbt[2] = {0, 1}, slg[2] = {0, 5};
        qp = fz_tensor(&c, &q, fp4 ? DG_FP4_E2M1X2 : DG_FLOAT8_E4M3, 4, sq, FZ_FILL_FLOAT);
        if (mx)
            qsfp = fz_tensor(&c, &qsf, DG_INT32, 3, sqsf, FZ_FILL_FLOAT);
        kvp = fz_tensor(&c, &kv, DG_UINT8, 4, skc, FZ_FILL_FLOAT);
        wp = fz_tensor(&c, &w, ldt == DG_BFLOAT16 && (fz_u8(&c.r) & 1) ? DG_BFLOAT16 : DG_FLOAT32, 2, sw,
                       FZ_FILL_FLOAT);
        btp = fz_tensor(&c, &bt, DG_INT32, 2, sbt, FZ_FILL_INDEX);
        int max_context_len = fz_int(&c.r);
        lgp = fz_tensor(&c, &lg, ldt, 2, slg, FZ_FILL_FLOAT);
        if (c.skip) {
            free(sm.data);
            goto out;
        }
        fz_output(&c, lgp);
        if (sel == 3 && !mx) {
            fn = "dg_fp8_paged_mqa_logits";
            st = dg_fp8_paged_mqa_logits(qp, kvp, wp, clp, btp, &sm, max_context_len, clean, idxp, lgp);
        } else {
            fn = "dg_fp8_fp4_paged_mqa_logits";
            st = dg_fp8_fp4_paged_mqa_logits(qp, qsfp, kvp, wp, clp, btp, &sm, max_context_len, clean, idxp, lgp);
        }
        free(sm.data);
    }
out:
    if (c.skip) {
        fz_finish(&c, DG_OK, fn);
        return -1;
    }
    fz_finish(&c, st, fn);
    return 0;
}
