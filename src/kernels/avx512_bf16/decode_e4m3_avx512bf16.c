/*
 * decode_e4m3_avx512bf16.c - the AVX-512 BF16 decode kernels' entry point for E4M3 rows (FP8
 * weights as stored), read in place or, where they crowd L1, staged (bodies and contract:
 * decode_avx512bf16.h; the staged forms are compiled apart, decode_e4m3_staged_avx512bf16.c).
 */
#include "decode_avx512bf16.h"

DECODE_SHAPES_TWO(e4m3_rows, FMT_E4M3, false)
DECODE_SHAPES_TWO(e4m3_rows_vbmi, FMT_E4M3V, false)

bool dg_decode_e4m3_avx512bf16(const dg_decode_job *j) {
    if (j->stage_rows)
        return dg_decode_e4m3_staged_avx512bf16(j);
    return j->byte_tables ? panel_dispatch(j, FMT_E4M3V, false, &e4m3_rows_vbmi) : panel_dispatch(j, FMT_E4M3, false, &e4m3_rows);
}
