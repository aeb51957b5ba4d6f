/*
 * decode_panels_avx512bf16.c - the AVX-512 BF16 decode kernels' entry points for BF16 rows and
 * for pre-packed E2M1 / E4M3 decode panels (bodies and contract: decode_avx512bf16.h).
 */
#include "decode_avx512bf16.h"

/* BF16 rows: one group per call, the shapes of decode_body only. */
#ifdef DG_DECODE_RUNTIME_SHAPES
bool dg_decode_bf16_avx512bf16(const dg_decode_job *j) { return decode_body(j, FMT_BF16, decode_m(j)); }
#else
DECODE_ONE_(bf16_rows, FMT_BF16, 1) DECODE_ONE_(bf16_rows, FMT_BF16, 2) DECODE_ONE_(bf16_rows, FMT_BF16, 3)
DECODE_ONE_(bf16_rows, FMT_BF16, 4) DECODE_ONE_(bf16_rows, FMT_BF16, 5) DECODE_ONE_(bf16_rows, FMT_BF16, 6)
DECODE_ONE_(bf16_rows, FMT_BF16, 7) DECODE_ONE_(bf16_rows, FMT_BF16, 8)
static const decode_shape_fn kBf16Rows[DG_DECODE_MAX_M + 1] = {NULL,        bf16_rows_1, bf16_rows_2,
                                                               bf16_rows_3, bf16_rows_4, bf16_rows_5,
                                                               bf16_rows_6, bf16_rows_7, bf16_rows_8};
bool dg_decode_bf16_avx512bf16(const dg_decode_job *j) { return kBf16Rows[decode_m(j)](j); }
#endif

DECODE_SHAPES_MORE(e2m1_panels, FMT_E2M1P, false)
DECODE_SHAPES_MORE(e4m3_panels, FMT_E4M3P, false)

bool dg_decode_e2m1p_avx512bf16(const dg_decode_job *j) { return panel_dispatch(j, FMT_E2M1P, false, &e2m1_panels); }
bool dg_decode_e4m3p_avx512bf16(const dg_decode_job *j) { return panel_dispatch(j, FMT_E4M3P, false, &e4m3_panels); }
