/*
 * decode_panels_avx512bf16.c - the AVX-512 BF16 decode kernels' entry points for BF16 rows and
 * for pre-packed E2M1 / E4M3 decode panels (bodies and contract: decode_avx512bf16.h).
 */
#include "decode_avx512bf16.h"

bool dg_decode_bf16_avx512bf16(const dg_decode_job *j) {
#ifdef DG_DECODE_RUNTIME_SHAPES
    return decode_body(j, FMT_BF16, decode_m(j));
#else
    switch (j->m) {
    case 1: return decode_body(j, FMT_BF16, 1);
    case 2: return decode_body(j, FMT_BF16, 2);
    case 3: return decode_body(j, FMT_BF16, 3);
    case 4: return decode_body(j, FMT_BF16, 4);
    case 5: return decode_body(j, FMT_BF16, 5);
    case 6: return decode_body(j, FMT_BF16, 6);
    case 7: return decode_body(j, FMT_BF16, 7);
    default: return decode_body(j, FMT_BF16, 8);
    }
#endif
}

DECODE_SHAPES_MORE(e2m1_panels, FMT_E2M1P, false)
DECODE_SHAPES_MORE(e4m3_panels, FMT_E4M3P, false)

bool dg_decode_e2m1p_avx512bf16(const dg_decode_job *j) { return panel_dispatch(j, FMT_E2M1P, false, &e2m1_panels); }
bool dg_decode_e4m3p_avx512bf16(const dg_decode_job *j) { return panel_dispatch(j, FMT_E4M3P, false, &e4m3_panels); }
