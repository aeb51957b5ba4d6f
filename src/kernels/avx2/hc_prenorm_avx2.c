/*
 * hc_prenorm_avx2.c - AVX2+FMA kernels of the fast HC prenorm GEMM (see hc_prenorm_kernels.h):
 * 8 partial sums per output; the micro kernel holds 2 rows x 6 columns of sums in 12 of the 16
 * ymm registers.
 */
#include "../hc_prenorm_kernels.h"

#include <immintrin.h>

#define R DG_HC_ROWS_AVX2
#define KC DG_HC_LD_AVX2 /* the row stride of pk and xa (the largest len is DG_HC_KC_AVX2) */
#define C DG_HC_COLS_AVX2

/* 8 BF16 -> 8 float32: widen to 32 bits and shift into the high half. */
static inline __m256 widen_bf16x8(__m128i h) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

void dg_hc_pack_avx2(const float *b, int64_t ldb, int64_t nsc, int64_t len, float *pk) {
    const int64_t padded = dg_align(len, 16);
    for (int64_t r = 0; r < DG_HC_NS; ++r) {
        float *row = pk + r * KC;
        int64_t i = 0;
        if (r < nsc) {
            for (; i + 8 <= len; i += 8)
                _mm256_storeu_ps(row + i, _mm256_loadu_ps(b + r * ldb + i));
            for (; i < len; ++i)
                row[i] = b[r * ldb + i];
        }
        for (; i < padded; ++i)
            row[i] = 0.0f;
    }
}

/* 8 BF16 at p, of which only the first n < 8 exist (the rest read as zero). */
static inline __m256 widen_bf16_tail(const uint16_t *p, int64_t n) {
    uint16_t t[8] = {0};
    for (int64_t j = 0; j < n; ++j)
        t[j] = p[j];
    return widen_bf16x8(_mm_loadu_si128((const __m128i *)t));
}

/* Converts NR rows, interleaved: the rows' square sums are independent FMA chains whose
 * latencies overlap. */
static inline __attribute__((always_inline)) void convert_rows(const uint16_t *a, int64_t lda, const int NR,
                                                              int64_t len, float *xa, float *sq, int64_t sf,
                                                              int first) {
    __m256 s[R];
#pragma GCC unroll 2
    for (int r = 0; r < NR; ++r)
        s[r] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(sq + r * sf);
    int64_t i = 0;
    for (; i + 8 <= len; i += 8)
#pragma GCC unroll 2
        for (int r = 0; r < NR; ++r) {
            const __m256 x = widen_bf16x8(_mm_loadu_si128((const __m128i *)(a + r * lda + i)));
            s[r] = _mm256_fmadd_ps(x, x, s[r]);
            _mm256_store_ps(xa + r * KC + i, x);
        }
    if (i < len) { /* nothing past a[len) is read */
#pragma GCC unroll 2
        for (int r = 0; r < NR; ++r) {
            const __m256 x = widen_bf16_tail(a + r * lda + i, len - i);
            s[r] = _mm256_fmadd_ps(x, x, s[r]);
            _mm256_store_ps(xa + r * KC + i, x);
        }
        i += 8;
    }
    if (i < dg_align(len, 16)) /* the rest of the zero padding to a multiple of 16 */
#pragma GCC unroll 2
        for (int r = 0; r < NR; ++r)
            _mm256_store_ps(xa + r * KC + i, _mm256_setzero_ps());
#pragma GCC unroll 2
    for (int r = 0; r < NR; ++r)
        _mm256_storeu_ps(sq + r * sf, s[r]);
}

void dg_hc_convert_avx2(const uint16_t *a, int64_t lda, int rows, int64_t len, float *xa, float *sq, int64_t sf,
                        int first) {
    if (rows >= 2)
        convert_rows(a, lda, 2, len, xa, sq, sf, first);
    else
        convert_rows(a, lda, 1, len, xa, sq, sf, first);
}

static inline __attribute__((always_inline)) void micro_rows(const float *xa, const int NR, int64_t len,
                                                            const float *pk, float *acc, int64_t sf, int first,
                                                            const uint16_t *pf) {
    __m256 c[R][C];
#pragma GCC unroll 2
    for (int r = 0; r < NR; ++r)
#pragma GCC unroll 6
        for (int n = 0; n < C; ++n)
            c[r][n] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + r * sf + 8 * n);
    for (int64_t i = 0; i < len; i += 8) {
        if (pf) /* 8 BF16 per step: every line of pf[0, len) is hinted once or more */
            _mm_prefetch((const char *)(pf + i), _MM_HINT_T0);
        __m256 x[R];
#pragma GCC unroll 2
        for (int r = 0; r < NR; ++r)
            x[r] = _mm256_load_ps(xa + r * KC + i);
#pragma GCC unroll 6
        for (int n = 0; n < C; ++n) {
            __m256 b = _mm256_load_ps(pk + n * KC + i);
            /* One load per panel row for all rows of A: without this barrier GCC folds the load
             * into each row's FMA (a load per FMA, which on Zen 3 made the kernel load-bound at
             * half its FMA rate). */
            __asm__("" : "+x"(b));
#pragma GCC unroll 2
            for (int r = 0; r < NR; ++r)
                c[r][n] = _mm256_fmadd_ps(x[r], b, c[r][n]);
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < NR; ++r)
#pragma GCC unroll 6
        for (int n = 0; n < C; ++n)
            _mm256_storeu_ps(acc + r * sf + 8 * n, c[r][n]);
}

void dg_hc_micro_avx2(const float *xa, int rows, int64_t len, const float *pk, float *acc, int64_t sf,
                       int first, const uint16_t *pf) {
    if (rows >= 2)
        micro_rows(xa, 2, len, pk, acc, sf, first, pf);
    else
        micro_rows(xa, 1, len, pk, acc, sf, first, pf);
}
