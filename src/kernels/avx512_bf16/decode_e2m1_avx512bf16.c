/*
 * decode_e2m1_avx512bf16.c - the AVX-512 BF16 decode kernels' entry point for E2M1 rows (FP4
 * weights as stored, two codes a byte), read in place or staged where they crowd L1 (bodies and
 * contract: decode_avx512bf16.h).
 */
#include "decode_avx512bf16.h"

DECODE_SHAPES_MORE(e2m1_rows, FMT_E2M1, false)
DECODE_SHAPES_MORE(e2m1_staged, FMT_E2M1, true)

bool dg_decode_e2m1_avx512bf16(const dg_decode_job *j) {
    return j->stage_rows ? panel_dispatch(j, FMT_E2M1, true, &e2m1_staged) : panel_dispatch(j, FMT_E2M1, false, &e2m1_rows);
}
