/*
 * e2m1_bf16_tables.h - the BF16 values of the 16 E2M1 codes as VPSHUFB tables (low byte, high
 * byte), which the AVX2 and AVX-512 BF16 decode kernels widen FP4 weights with, and the biased
 * high bytes through which they apply folded power-of-two scales.
 *
 * Scaled rows widen through the biased table: every nonzero value times 2^E2M1_BIAS (its
 * exponent field + 126: 0x7e00 .. 0x7fc0 for 0.5 .. 6, an integer that is never a float
 * operand), both zeros as +0; then one VPSUBUSW of (126 - e) << 7 per lane gives value * 2^e
 * for the nonzero values (no borrow: for the e in [-125, 125] the kernels admit the result is
 * a normal number, so the magnitude stays above the subtrahend, and the sign bit is untouched)
 * and saturates the zeros at +0. That is the product value * 2^e except -0 for +0, which leaves
 * the chain's sums as they are (the accumulators start at +0, and x + -0 = x + +0 for every x
 * but -0, which no accumulator holds). The low bytes are the unbiased table's (0x7e00 has a
 * zero low byte).
 */
#ifndef DG_KERNELS_E2M1_BF16_TABLES_H
#define DG_KERNELS_E2M1_BF16_TABLES_H

#include <stdint.h>

#define E2M1_BIAS 126

static const uint8_t kE2m1Bf16Lo[16] = {0x00, 0x00, 0x80, 0xc0, 0x00, 0x40, 0x80, 0xc0,
                                        0x00, 0x00, 0x80, 0xc0, 0x00, 0x40, 0x80, 0xc0};
static const uint8_t kE2m1Bf16Hi[16] = {0x00, 0x3f, 0x3f, 0x3f, 0x40, 0x40, 0x40, 0x40,
                                        0x80, 0xbf, 0xbf, 0xbf, 0xc0, 0xc0, 0xc0, 0xc0};
static const uint8_t kE2m1Bf16HiBiased[16] = {0x00, 0x7e, 0x7e, 0x7e, 0x7f, 0x7f, 0x7f, 0x7f,
                                              0x00, 0xfe, 0xfe, 0xfe, 0xff, 0xff, 0xff, 0xff};

#endif /* DG_KERNELS_E2M1_BF16_TABLES_H */
