/*
 * convert.c - dg_convert_tensor (the work behind dg_cast) and the choice of run kernels.
 *
 * Strided tensors are first simplified: dimensions of extent 1 are dropped and neighbours that
 * are contiguous in BOTH tensors are merged, so a contiguous tensor becomes one run. The
 * innermost dimension is then handed to a run kernel when it has unit stride in both tensors
 * and the dtype pair has one; everything else goes element by element through the scalar
 * functions, which define the bits either way.
 */
#include "convert.h"

#include <string.h>

static const dg_convert_kernels kGeneric = {
    .f32_to_e4m3 = dg_f32_to_e4m3_generic,
    .f32_to_bf16 = dg_f32_to_bf16_generic,
    .e4m3_to_f32 = dg_e4m3_to_f32_generic,
    .e4m3_to_bf16 = dg_e4m3_to_bf16_generic,
};

#if DG_HAVE_AVX2_KERNELS
static const dg_convert_kernels kAvx2 = {
    .f32_to_e4m3 = dg_f32_to_e4m3_avx2,
    .f32_to_bf16 = dg_f32_to_bf16_avx2,
    .e4m3_to_f32 = dg_e4m3_to_f32_avx2,
    .e4m3_to_bf16 = dg_e4m3_to_bf16_avx2,
};
#endif

#if DG_HAVE_AVX512_KERNELS
static const dg_convert_kernels kAvx512 = {
    .f32_to_e4m3 = dg_f32_to_e4m3_avx512,
    .f32_to_bf16 = dg_f32_to_bf16_avx512,
    .e4m3_to_f32 = dg_e4m3_to_f32_avx512,
    .e4m3_to_bf16 = dg_e4m3_to_bf16_avx512,
};
#endif

const dg_convert_kernels *dg_convert_kernels_for(dg_isa isa) {
#if DG_HAVE_AVX512_KERNELS
    if (isa >= DG_ISA_AVX512)
        return &kAvx512;
#endif
#if DG_HAVE_AVX2_KERNELS
    if (isa >= DG_ISA_AVX2)
        return &kAvx2;
#endif
    (void)isa;
    return &kGeneric;
}

/* One element through float32; the same dtype is a plain copy of the bits (as torch's copy_). */
static void convert_one(dg_dtype st, const void *sp, dg_dtype dt, void *dp) {
    if (st == dt) {
        memcpy(dp, sp, dg_dtype_size(st));
        return;
    }
    float v;
    switch (st) {
    case DG_FLOAT32: memcpy(&v, sp, 4); break;
    case DG_BFLOAT16: v = dg_bf16_to_float(*(const uint16_t *)sp); break;
    default: v = dg_e4m3_to_float(*(const uint8_t *)sp); break;
    }
    switch (dt) {
    case DG_FLOAT32: memcpy(dp, &v, 4); break;
    case DG_BFLOAT16: *(uint16_t *)dp = dg_float_to_bf16(v); break;
    default: *(uint8_t *)dp = dg_float_to_e4m3(v); break;
    }
}

/* A contiguous run of n elements; false when the dtype pair has no run kernel. */
static bool convert_run(const dg_convert_kernels *k, dg_dtype st, const void *sp, dg_dtype dt, void *dp,
                        size_t n) {
    if (st == dt)
        memcpy(dp, sp, n * dg_dtype_size(st));
    else if (st == DG_FLOAT32 && dt == DG_FLOAT8_E4M3)
        k->f32_to_e4m3(sp, dp, n);
    else if (st == DG_FLOAT32 && dt == DG_BFLOAT16)
        k->f32_to_bf16(sp, dp, n);
    else if (st == DG_FLOAT8_E4M3 && dt == DG_FLOAT32)
        k->e4m3_to_f32(sp, dp, n);
    else if (st == DG_FLOAT8_E4M3 && dt == DG_BFLOAT16)
        k->e4m3_to_bf16(sp, dp, n);
    else
        return false;
    return true;
}

void dg_convert_tensor(const dg_tensor *src, const dg_tensor *dst) {
    /* Simplified geometry: extents and strides of both tensors, outermost first. */
    int64_t shape[DG_MAX_DIMS], ss[DG_MAX_DIMS], ds[DG_MAX_DIMS];
    int nd = 0;
    for (int i = 0; i < src->ndim; ++i) {
        if (src->shape[i] == 0)
            return;
        if (src->shape[i] == 1)
            continue;
        if (nd > 0 && ss[nd - 1] == src->strides[i] * src->shape[i] &&
            ds[nd - 1] == dst->strides[i] * src->shape[i]) {
            shape[nd - 1] *= src->shape[i]; /* merge into the outer neighbour */
            ss[nd - 1] = src->strides[i];
            ds[nd - 1] = dst->strides[i];
            continue;
        }
        shape[nd] = src->shape[i];
        ss[nd] = src->strides[i];
        ds[nd] = dst->strides[i];
        ++nd;
    }
    if (nd == 0) { /* a single element */
        shape[0] = 1;
        ss[0] = ds[0] = 1;
        nd = 1;
    }
    const dg_convert_kernels *k = dg_convert_kernels_for(dg_get_isa());
    const size_t sz = dg_dtype_size(src->dtype), dz = dg_dtype_size(dst->dtype);
    const int64_t inner = shape[nd - 1], sin = ss[nd - 1], din = ds[nd - 1];
    int64_t idx[DG_MAX_DIMS] = {0};
    do {
        int64_t so = 0, dof = 0;
        for (int i = 0; i < nd - 1; ++i) {
            so += idx[i] * ss[i];
            dof += idx[i] * ds[i];
        }
        const char *sp = (const char *)src->data + so * (int64_t)sz;
        char *dp = (char *)dst->data + dof * (int64_t)dz;
        if (sin == 1 && din == 1 && convert_run(k, src->dtype, sp, dst->dtype, dp, (size_t)inner))
            continue;
        for (int64_t j = 0; j < inner; ++j)
            convert_one(src->dtype, sp + j * sin * (int64_t)sz, dst->dtype, dp + j * din * (int64_t)dz);
    } while (dg_index_next(idx, shape, nd - 1));
}
