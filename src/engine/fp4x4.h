/*
 * fp4x4.h - FP4 x FP4 GEMMs on integer dot products (both operands E2M1, scale blocks of a
 * multiple of 32 elements). dg_engine_gemm hands such pairs here (fp4x4.c).
 *
 * 2 x an E2M1 value is an integer in [-12, 12], so within one scale block of gblk elements
 * (gblk = gcd of A's and B's gran_k) the dot product of the doubled codes is an exact int32.
 * ---- Order (every ISA, M, tiling and thread count gives these bits) ------------------------
 *   acc = 0
 *   for kb = 0, 1, ... (K blocks of gblk, increasing; the last one may be short):
 *       dot = sum_{k in block kb} (2 a[i, k]) * (2 b[j, k])          exact int32
 *       s   = (0.25f * sa[i, kb]) * sb[j, kb]                         two float32 products
 *       acc = fmaf((float)dot, s, acc)                                 one rounding
 *   D[i, j] = round_D(C[i, j] + acc)       (float32 add, then BF16 rounding for BF16 D)
 * where sa, sb are the float32 scales of the block (UE8M0 decoded exactly).
 *
 * ---- Panels (MR = NR = 32 rows, K padded with zeros to Kp = multiple of 32) -----------------
 *   A panel: int8  [Kp / 32][32 rows][32]     (one AMX A tile pair per k step of 32)
 *            plus float sa4[nkb][32] = 0.25f * sa, rows past M: 0
 *            values 2a, or 2a + 12 (unsigned, for VPDPBUSD) when the kernel asks (a_bias)
 *   B panel: int8  [Kp / 4][32 cols][4]       (VNNI-4: AMX B tiles, VPDPBUSD vectors)
 *            plus float sb[nkb][32] and int32 bsum[nkb][32] = -12 * sum of 2b over the block
 *            (the correction of the unsigned A), columns past N: 0
 * Microkernel: one 32 x 32 tile over `steps` k steps of 32 starting at a block boundary,
 * blocks of `spb` steps (the last one may be short), acc[32][32] (row stride 32) updated as
 * above; only rows < `rows` need be computed.
 */
#ifndef DG_ENGINE_FP4X4_H
#define DG_ENGINE_FP4X4_H

#include "engine.h"

#define DG_F4_MR 32
#define DG_F4_NR 32
#define DG_F4_KS 32 /* k per step */

typedef void (*dg_f4_ukr_fn)(int64_t steps, int spb, int rows, const int8_t *a, const int8_t *b, const float *sa4,
                             const float *sb, const int32_t *bsum, float *acc);

/* Both operands E2M1 (not grouped), K > 0, scale blocks a multiple of 32. */
bool dg_engine_fp4x4_applies(const dg_operand *a, const dg_operand *b);
/* D = C + A @ B^T in the order above (allocation failures are the only errors). */
dg_status dg_engine_gemm_fp4x4(const dg_operand *a, const dg_operand *b, const dg_tensor *d, const dg_tensor *c);

/* Kernels (src/kernels/<isa>/fp4x4_*.c). The VNNI kernel takes A with a_bias 12. */
void dg_f4_ukr_generic(int64_t steps, int spb, int rows, const int8_t *a, const int8_t *b, const float *sa4,
                       const float *sb, const int32_t *bsum, float *acc);
void dg_f4_ukr_vnni(int64_t steps, int spb, int rows, const int8_t *a, const int8_t *b, const float *sa4,
                    const float *sb, const int32_t *bsum, float *acc);
/* AVX-512 packers of K-major FP4 (unit stride along K; kbytes = K / 2 valid bytes per row, rows
 * <= 32 valid rows): the bytes of the portable packer, bsum included (fp4x4_pack.c). The B
 * packers also prefetch into L2 the first next_rows rows of the next panel (next: its first
 * row, same ld; NULL: none), a line of each row as they pack the same line of this one. */
void dg_f4_pack_a_avx512(const uint8_t *src, int64_t ld, int rows, int64_t kbytes, int64_t steps, int bias,
                         int8_t *dst);
void dg_f4_pack_b_avx512(const uint8_t *src, int64_t ld, int rows, int64_t kbytes, int64_t steps, int spb,
                         int8_t *dst, int32_t *bsum, const uint8_t *next, int next_rows);
/* The AVX2 twins (kernels/avx2/fp4x4_avx2.c): A with a_bias 12, the same bytes and bits. */
void dg_f4_ukr_avx2(int64_t steps, int spb, int rows, const int8_t *a, const int8_t *b, const float *sa4,
                    const float *sb, const int32_t *bsum, float *acc);
void dg_f4_pack_a_avx2(const uint8_t *src, int64_t ld, int rows, int64_t kbytes, int64_t steps, int bias,
                       int8_t *dst);
void dg_f4_pack_b_avx2(const uint8_t *src, int64_t ld, int rows, int64_t kbytes, int64_t steps, int spb,
                       int8_t *dst, int32_t *bsum, const uint8_t *next, int next_rows);
void dg_f4_ukr_amx_begin(void);
void dg_f4_ukr_amx(int64_t steps, int spb, int rows, const int8_t *a, const int8_t *b, const float *sa4,
                   const float *sb, const int32_t *bsum, float *acc);

#endif /* DG_ENGINE_FP4X4_H */
