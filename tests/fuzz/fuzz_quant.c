/*
 * fuzz_quant.c - libFuzzer harness over the quantisation casts and format helpers: dg_cast,
 * per-token / per-block / per-channel / per-custom-dims FP8 casts, per-token FP4 cast,
 * dg_cast_back_from_fp4, dg_cast_back_from_fp8, dg_ceil_to_ue8m0_tensor, UE8M0 pack/unpack,
 * dg_transpose_packed_fp4 and dg_calc_diff. Outputs are fuzzed descriptors or the query form (answered, then called
 * again). See fuzz_common.h.
 */
#include "fuzz_common.h"

/* vocabulary slots: 0 M, 1 K, 2 scale columns, 3 extra dim, 4, 5 misc */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_ctx c;
    fz_init(&c, data, size);
    fz_settings(&c);
    /* selector bytes 253 and 254 (in no seed) reach dg_cast_back_from_fp8 (12): every other byte
     * keeps the case it had before it was added, so the seed corpus still tests what it did */
    const uint8_t sb = fz_u8(&c.r);
    uint8_t sel = (sb == 253 || sb == 254) ? 12 : sb % 12;
    dg_tensor x, y, out, osf;
    dg_tensor *xp, *yp, *op, *osp;
    dg_status st = DG_OK;
    const char *fn = "dg_quant";
    static const int s2[2] = {0, 1}, sc[2] = {0, 2}, s4[4] = {3, 0, 1, 4}, st2[2] = {1, 0};
    int use_ue8m0 = fz_u8(&c.r) & 1, gran_k = fz_gran(&c.r), packed = fz_u8(&c.r) & 1;
    int query = fz_u8(&c.r) & 1;
    dg_dtype xdt = (fz_u8(&c.r) & 1) ? DG_BFLOAT16 : DG_FLOAT32;
    memset(&out, 0, sizeof out);
    memset(&osf, 0, sizeof osf);
    op = &out, osp = &osf;
    if (sel <= 4) { /* casts with (out, out_sf) */
        int dims[6], nd = fz_u8(&c.r) % 7;
        for (int i = 0; i < nd; ++i)
            dims[i] = (int)(fz_u8(&c.r) % 8) - 1;
        int xnd = sel == 3 ? (int)(fz_u8(&c.r) % 5) : 2;
        xp = fz_tensor(&c, &x, xdt, xnd, sel == 3 ? s4 : s2, FZ_FILL_FLOAT);
        if (!query) {
            dg_dtype odt = sel == 4 ? ((fz_u8(&c.r) & 1) ? DG_INT8 : DG_FP4_E2M1X2) : DG_FLOAT8_E4M3;
            op = fz_tensor(&c, &out, odt, xnd, sel == 3 ? s4 : s2, FZ_FILL_FLOAT);
            osp = fz_tensor(&c, &osf, packed ? DG_INT32 : DG_FLOAT32, 2, sc, FZ_FILL_FLOAT);
        }
        if (c.skip)
            goto out;
        fz_output(&c, op);
        fz_output(&c, osp);
        for (int pass = 0; pass < 2; ++pass) {
            switch (sel) {
            case 0: fn = "dg_per_token_cast_to_fp8"; st = dg_per_token_cast_to_fp8(xp, use_ue8m0, gran_k, packed, op, osp); break;
            case 1: fn = "dg_per_block_cast_to_fp8"; st = dg_per_block_cast_to_fp8(xp, use_ue8m0, gran_k, op, osp); break;
            case 2: fn = "dg_per_channel_cast_to_fp8"; st = dg_per_channel_cast_to_fp8(xp, use_ue8m0, gran_k, op, osp); break;
            case 3: fn = "dg_per_custom_dims_cast_to_fp8"; st = dg_per_custom_dims_cast_to_fp8(xp, nd ? dims : NULL, nd, use_ue8m0, op, osp); break;
            default: fn = "dg_per_token_cast_to_fp4"; st = dg_per_token_cast_to_fp4(xp, use_ue8m0, gran_k, packed, op, osp); break;
            }
            if (pass == 1)
                fz_expect_ok(st, fn);
            if (st != DG_OK || !query || !op || !osp || op->data || osp->data)
                break;
            /* the query form answered both: back them and call again */
            if (!fz_answer(&c, op) || !fz_answer(&c, osp))
                break;
        }
        goto out;
    }
    /* one input, one output (or two inputs) */
    switch (sel) {
    case 5: /* cast */
        xp = fz_tensor(&c, &x, xdt, 2, s2, FZ_FILL_FLOAT);
        {
            static const dg_dtype dts[4] = {DG_FLOAT32, DG_BFLOAT16, DG_FLOAT8_E4M3, DG_INT32};
            uint8_t m = fz_u8(&c.r);
            op = (m & 0x10) ? xp : fz_tensor(&c, &out, dts[m % 4], 2, s2, FZ_FILL_FLOAT);
        }
        if (c.skip)
            goto out;
        if (op != xp)
            fz_output(&c, op);
        fn = "dg_cast";
        st = dg_cast(xp, op);
        goto out;
    case 6:  /* cast_back_from_fp4 */
    case 12: /* cast_back_from_fp8 (same arguments) */
    {
        const int fp8 = sel == 12;
        dg_status (*cast_back)(const dg_tensor *, const dg_tensor *, int, int, dg_tensor *) =
            fp8 ? dg_cast_back_from_fp8 : dg_cast_back_from_fp4;
        xp = fz_tensor(&c, &x, fp8 ? DG_FLOAT8_E4M3 : (fz_u8(&c.r) & 1) ? DG_INT8 : DG_FP4_E2M1X2, 2, s2,
                       FZ_FILL_FLOAT);
        yp = fz_tensor(&c, &y, packed ? DG_INT32 : DG_FLOAT32, 2, sc, FZ_FILL_FLOAT);
        if (!query)
            op = fz_tensor(&c, &out, xdt, 2, s2, FZ_FILL_FLOAT);
        if (c.skip)
            goto out;
        fz_output(&c, op);
        fn = fp8 ? "dg_cast_back_from_fp8" : "dg_cast_back_from_fp4";
        st = cast_back(xp, yp, gran_k, packed, op);
        if (st == DG_OK && query && op && !op->data && fz_answer(&c, op))
            fz_expect_ok(cast_back(xp, yp, gran_k, packed, op), fn);
        goto out;
    }
    case 7: /* ceil_to_ue8m0_tensor */
        xp = fz_tensor(&c, &x, xdt, 2, s2, FZ_FILL_FLOAT);
        op = (fz_u8(&c.r) & 1) ? xp : fz_tensor(&c, &out, DG_FLOAT32, 2, s2, FZ_FILL_FLOAT);
        if (c.skip)
            goto out;
        if (op != xp)
            fz_output(&c, op);
        fn = "dg_ceil_to_ue8m0_tensor";
        st = dg_ceil_to_ue8m0_tensor(xp, op);
        goto out;
    case 8: /* pack / unpack UE8M0 */
    case 9:
        xp = fz_tensor(&c, &x, sel == 8 ? DG_FLOAT32 : DG_INT32, 2, s2, sel == 8 ? FZ_FILL_INDEX : FZ_FILL_FLOAT);
        if (sel == 8 && xp && xp->data && !c.skip && xp->dtype == DG_FLOAT32 && (fz_u8(&c.r) & 1)) { /* valid scales: powers of two */
            int64_t lo, bytes;
            if (fz_bytes(xp, &lo, &bytes) && bytes <= FZ_MAX_SPAN) /* not the 16-byte stand-in */
                for (int64_t i = 0; i + 4 <= bytes; i += 4) {
                    uint32_t bits = (uint32_t)(100 + i % 50) << 23;
                    memcpy((uint8_t *)xp->data + lo * 4 + i, &bits, 4);
                }
        }
        if (!query)
            op = fz_tensor(&c, &out, sel == 8 ? DG_INT32 : DG_FLOAT32, 2, s2, FZ_FILL_FLOAT);
        if (c.skip)
            goto out;
        fz_output(&c, op);
        fn = sel == 8 ? "dg_pack_ue8m0_to_int" : "dg_unpack_ue8m0_from_int";
        st = sel == 8 ? dg_pack_ue8m0_to_int(xp, op) : dg_unpack_ue8m0_from_int(xp, op);
        if (st == DG_OK && query && op && !op->data && fz_answer(&c, op))
            fz_expect_ok(sel == 8 ? dg_pack_ue8m0_to_int(xp, op) : dg_unpack_ue8m0_from_int(xp, op), fn);
        goto out;
    case 10: /* transpose packed FP4 */
        xp = fz_tensor(&c, &x, (fz_u8(&c.r) & 1) ? DG_INT8 : DG_FP4_E2M1X2, 2, s2, FZ_FILL_FLOAT);
        if (!query)
            op = fz_tensor(&c, &out, x.dtype, 2, st2, FZ_FILL_FLOAT);
        if (c.skip)
            goto out;
        fz_output(&c, op);
        fn = "dg_transpose_packed_fp4";
        st = dg_transpose_packed_fp4(xp, op);
        if (st == DG_OK && query && op && !op->data && fz_answer(&c, op))
            fz_expect_ok(dg_transpose_packed_fp4(xp, op), fn);
        goto out;
    default: { /* calc_diff */
        double r = -1;
        xp = fz_tensor(&c, &x, xdt, 2, s2, FZ_FILL_FLOAT);
        yp = fz_tensor(&c, &y, (fz_u8(&c.r) & 1) ? DG_BFLOAT16 : DG_FLOAT32, 2, s2, FZ_FILL_FLOAT);
        if (c.skip)
            goto out;
        fn = "dg_calc_diff";
        st = dg_calc_diff(xp, yp, (fz_u8(&c.r) == 255) ? NULL : &r);
        goto out;
    }
    }
out:
    if (c.skip) {
        fz_finish(&c, DG_OK, fn);
        return -1;
    }
    fz_finish(&c, st, fn);
    return 0;
}
