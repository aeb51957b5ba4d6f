/*
 * fuzz_sf_layout.c - libFuzzer harness over the scale-factor layout helpers:
 * dg_get_tma_aligned_size, dg_get_mn_major_tma_aligned_tensor, the packed UE8M0 forms (with
 * psum layouts), the k-grouped form and dg_transform_sf_into_required_layout. Each runs in its
 * query form first; when that answers, the answer is backed exactly and the call made again,
 * which must then succeed (or fail for the input's values, e.g. scales that are no powers of
 * two). A given output descriptor is also tried directly. See fuzz_common.h.
 */
#include "fuzz_common.h"

/* vocabulary slots: 0 G, 1 MN, 2 SK, 3 groups of a layout, 4 mn, 5 k */

static dg_status call(int sel, fz_ctx *c, const dg_tensor *sf, const dg_tensor *lay, const int *ks, int nks,
                      const int *p, dg_tensor *out) {
    switch (sel) {
    case 1: return dg_get_mn_major_tma_aligned_tensor(sf, out);
    case 2: return dg_get_mn_major_tma_aligned_packed_ue8m0_tensor(sf, lay, out);
    case 3: return dg_get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(sf, lay, ks, nks, p[0], p[1], p[2], out);
    default:
        return dg_transform_sf_into_required_layout(sf, c->vocab[4], c->vocab[5], p + 3, p[6], p[7], p[8], p[9],
                                                    lay, out);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_ctx c;
    fz_init(&c, data, size);
    fz_settings(&c);
    uint8_t sel = fz_u8(&c.r) % 5;
    dg_tensor sf, lay, out;
    dg_tensor *sfp, *lp = NULL;
    dg_status st = DG_OK;
    const char *fn = "dg_sf_layout";
    if (sel == 0) {
        int x = fz_int(&c.r), es = fz_int(&c.r), r = -7;
        fn = "dg_get_tma_aligned_size";
        st = dg_get_tma_aligned_size(x, es, (fz_u8(&c.r) == 255) ? NULL : &r);
        goto out;
    }
    int three = fz_u8(&c.r) & 1;
    static const int s3[3] = {0, 1, 2}, s2[2] = {1, 2}, sl[1] = {3};
    uint8_t m = fz_u8(&c.r);
    sfp = fz_tensor(&c, &sf, (m & 1) ? DG_INT32 : DG_FLOAT32, three ? 3 : 2, three ? s3 : s2, FZ_FILL_FLOAT);
    if (m & 2)
        lp = fz_tensor(&c, &lay, DG_INT32, 1, sl, FZ_FILL_INDEX);
    int ks[8], nks = fz_u8(&c.r) % 9;
    for (int i = 0; i < nks; ++i)
        ks[i] = (int)((unsigned)fz_int(&c.r) * ((fz_u8(&c.r) & 1) ? 32u : 1u)); /* wraps */
    int p[10];
    p[0] = fz_gran(&c.r);                 /* gran_k */
    p[1] = fz_gran(&c.r);                 /* k_alignment */
    p[2] = fz_u8(&c.r) % 3;               /* use_psum_layout */
    p[3] = fz_gran(&c.r), p[4] = fz_gran(&c.r), p[5] = fz_gran(&c.r); /* recipe */
    p[6] = 2 + (int)(fz_u8(&c.r) % 3) - 1; /* recipe_len 1..3 */
    p[7] = (int)((unsigned)fz_int(&c.r) - 1u); /* num_groups (wraps) */
    p[8] = (int)(fz_u8(&c.r) % 4) - 1;    /* is_sfa */
    p[9] = fz_u8(&c.r) & 1;               /* disable_ue8m0_cast */
    /* a fuzzed output, or the query form */
    dg_tensor *op = NULL;
    if (fz_u8(&c.r) & 1) {
        static const int so3[3] = {0, 1, 5}, so2[2] = {1, 5};
        op = fz_tensor(&c, &out, (fz_u8(&c.r) & 1) ? DG_INT32 : DG_FLOAT32, three ? 3 : 2, three ? so3 : so2,
                       FZ_FILL_FLOAT);
    }
    if (c.skip)
        goto out;
    if (op) {
        fz_output(&c, op);
        st = call(sel, &c, sfp, lp, nks ? ks : NULL, nks, p, op);
        goto out;
    }
    memset(&out, 0, sizeof out);
    out.data = NULL;
    st = call(sel, &c, sfp, lp, nks ? ks : NULL, nks, p, &out);
    if (st == DG_OK && out.data == NULL && fz_answer(&c, &out)) {
        st = call(sel, &c, sfp, lp, nks ? ks : NULL, nks, p, &out);
        fz_expect_ok(st, fn);
    }
out:
    if (c.skip) {
        fz_finish(&c, DG_OK, fn);
        return -1;
    }
    fz_finish(&c, st, fn);
    return 0;
}
