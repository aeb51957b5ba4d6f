/*
 * fuzz_hc_einsum.c - libFuzzer harness over the argument checking of the HC prenorm GEMM,
 * dg_einsum and dg_fp8_einsum (every supported expression, unknown ones, C forms, recipes).
 * See fuzz_common.h.
 */
#include "fuzz_common.h"

/* vocabulary slots: 0 B/S/M, 1 H/N, 2 D/K, 3 R, 4 scale extent, 5 splits */

static const char *const exprs[] = {"bmk,bnk->mn", "bhr,hdr->bhd", "bhd,hdr->bhr", "bhd,bhr->hdr",
                                    "mk,nk->mn",   "",             "bmk,bnk->mn ", "bhr,hdr->bhd,x"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_ctx c;
    fz_init(&c, data, size);
    fz_settings(&c);
    uint8_t sel = fz_u8(&c.r) % 3;
    dg_tensor a, b, d, cc, sfa, sfb, sq;
    dg_tensor *ap, *bp, *dp, *cp = NULL, *sfap, *sfbp, *sqp;
    dg_status st = DG_OK;
    const char *fn = "?";
    if (sel == 0) {
        int splits = (fz_u8(&c.r) & 1) ? 0 : fz_int(&c.r);
        static const int sa[2] = {0, 2}, sb[2] = {1, 2}, sd[2] = {0, 1}, sd3[3] = {5, 0, 1}, ss[1] = {0},
                         ss2[2] = {5, 0};
        ap = fz_tensor(&c, &a, DG_BFLOAT16, 2, sa, FZ_FILL_FLOAT);
        bp = fz_tensor(&c, &b, DG_FLOAT32, 2, sb, FZ_FILL_FLOAT);
        dp = fz_tensor(&c, &d, DG_FLOAT32, splits > 0 ? 3 : 2, splits > 0 ? sd3 : sd, FZ_FILL_FLOAT);
        sqp = fz_tensor(&c, &sq, DG_FLOAT32, splits > 0 ? 2 : 1, splits > 0 ? ss2 : ss, FZ_FILL_FLOAT);
        if (c.skip)
            goto out;
        fz_output(&c, dp);
        fz_output(&c, sqp);
        fn = "dg_tf32_hc_prenorm_gemm";
        st = dg_tf32_hc_prenorm_gemm(ap, bp, dp, sqp, splits);
        goto out;
    }
    uint8_t e = fz_u8(&c.r);
    const char *expr = (e & 0x80) ? NULL : exprs[e % 8];
    int ei = e % 8;
    /* shapes per expression (a, b, d), slots as above */
    static const int shp[4][3][3] = {{{0, 1, 2}, {0, 3, 2}, {1, 3, -1}},  /* bmk,bnk->mn: [S,M,K] [S,N,K] [M,N] */
                                     {{0, 1, 3}, {1, 2, 3}, {0, 1, 2}},  /* bhr,hdr->bhd */
                                     {{0, 1, 2}, {1, 2, 3}, {0, 1, 3}},  /* bhd,hdr->bhr */
                                     {{0, 1, 2}, {0, 1, 3}, {1, 2, 3}}}; /* bhd,bhr->hdr */
    int k = ei < 4 ? ei : fz_u8(&c.r) % 4;
    int dnd = k == 0 ? 2 : 3;
    if (sel == 1) {
        ap = fz_tensor(&c, &a, DG_BFLOAT16, 3, shp[k][0], FZ_FILL_FLOAT);
        bp = fz_tensor(&c, &b, DG_BFLOAT16, 3, shp[k][1], FZ_FILL_FLOAT);
        dg_dtype ddt = (fz_u8(&c.r) & 1) ? DG_FLOAT32 : DG_BFLOAT16;
        dp = fz_tensor(&c, &d, ddt, dnd, shp[k][2], FZ_FILL_FLOAT);
        uint8_t cm = fz_u8(&c.r);
        cp = cm < 128 ? NULL : cm < 192 ? dp : fz_tensor(&c, &cc, ddt, dnd, shp[k][2], FZ_FILL_FLOAT);
        if (c.skip)
            goto out;
        fz_output(&c, dp);
        fn = "dg_einsum";
        st = dg_einsum(expr, ap, bp, dp, cp);
    } else {
        uint8_t m = fz_u8(&c.r);
        ap = fz_tensor(&c, &a, DG_FLOAT8_E4M3, 3, shp[k][0], FZ_FILL_FLOAT);
        int ssa[3] = {shp[k][0][0], shp[k][0][1], 4};
        sfap = fz_tensor(&c, &sfa, (m & 1) ? DG_INT32 : DG_FLOAT32, 3, ssa, FZ_FILL_FLOAT);
        bp = fz_tensor(&c, &b, DG_FLOAT8_E4M3, 3, shp[k][1], FZ_FILL_FLOAT);
        int ssb[3] = {shp[k][1][0], 4, 4};
        sfbp = fz_tensor(&c, &sfb, (m & 2) ? DG_INT32 : DG_FLOAT32, 3, ssb, FZ_FILL_FLOAT);
        dg_dtype ddt = (fz_u8(&c.r) & 1) ? DG_FLOAT32 : DG_BFLOAT16;
        dp = fz_tensor(&c, &d, ddt, dnd, shp[k][2], FZ_FILL_FLOAT);
        uint8_t cm = fz_u8(&c.r);
        cp = cm < 128 ? NULL : cm < 192 ? dp : fz_tensor(&c, &cc, ddt, dnd, shp[k][2], FZ_FILL_FLOAT);
        int recipe[3] = {fz_gran(&c.r), fz_gran(&c.r), fz_gran(&c.r)};
        const int *rp = (m & 4) ? recipe : NULL;
        if (c.skip)
            goto out;
        fz_output(&c, dp);
        fn = "dg_fp8_einsum";
        st = dg_fp8_einsum(expr, ap, sfap, bp, sfbp, dp, cp, rp);
    }
out:
    if (c.skip) {
        fz_finish(&c, DG_OK, fn);
        return -1;
    }
    fz_finish(&c, st, fn);
    return 0;
}
