/*
 * decode_e4m3_staged_avx512bf16.c - E4M3 rows staged into L1 (dg_decode_job.stage_rows): the
 * staged instantiations of decode_avx512bf16.h's bodies, called by dg_decode_e4m3_avx512bf16.
 */
#include "decode_avx512bf16.h"

DECODE_SHAPES_TWO(e4m3_staged, FMT_E4M3, true)
DECODE_SHAPES_TWO(e4m3_staged_vbmi, FMT_E4M3V, true)

bool dg_decode_e4m3_staged_avx512bf16(const dg_decode_job *j) {
    return j->byte_tables ? panel_dispatch(j, FMT_E4M3V, true, &e4m3_staged_vbmi) : panel_dispatch(j, FMT_E4M3, true, &e4m3_staged);
}
