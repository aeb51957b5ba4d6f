/*
 * hc_prenorm_avx512.c - AVX-512 kernels of the fast HC prenorm GEMM (see hc_prenorm_kernels.h):
 * 16 partial sums per output; the micro kernel holds 4 rows x 6 columns of sums in 24 zmm
 * registers, so each step loads 4 A and 6 B vectors for 24 FMAs (loads, not FMAs, are what
 * limits a kernel of this shape on this core).
 */
#include "../hc_prenorm_kernels.h"

#include <immintrin.h>

#define R DG_HC_ROWS_AVX512
#define C DG_HC_COLS_AVX512

/* 16 BF16 -> 16 float32: widen to 32 bits and shift into the high half. */
static inline __m512 widen_bf16x16(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

void dg_hc_pack_avx512(const float *b, int64_t ldb, int64_t nsc, int64_t len, float *pk) {
    const int64_t padded = dg_align(len, 16);
    for (int64_t r = 0; r < DG_HC_NS; ++r) {
        float *row = pk + r * DG_HC_KC;
        int64_t i = 0;
        if (r < nsc) {
            for (; i + 16 <= len; i += 16)
                _mm512_storeu_ps(row + i, _mm512_loadu_ps(b + r * ldb + i));
            for (; i < len; ++i)
                row[i] = b[r * ldb + i];
        }
        for (; i < padded; ++i)
            row[i] = 0.0f;
    }
}

/* Converts NR rows, interleaved: the rows' square sums are independent FMA chains, so their
 * latencies overlap (one row alone would wait on its chain every step). */
static inline __attribute__((always_inline)) void convert_rows(const uint16_t *a, int64_t lda, const int NR,
                                                              int64_t len, float *xa, float *sq, int64_t sf,
                                                              int first) {
    __m512 s[R];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r)
        s[r] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(sq + r * sf);
    int64_t i = 0;
    for (; i + 16 <= len; i += 16)
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) {
            const __m512 x = widen_bf16x16(_mm256_loadu_si256((const __m256i *)(a + r * lda + i)));
            s[r] = _mm512_fmadd_ps(x, x, s[r]);
            _mm512_store_ps(xa + r * DG_HC_KC + i, x);
        }
    if (i < len) { /* masked: nothing past a[len) is read, zeros are stored */
        const __mmask16 m = (__mmask16)((1u << (len - i)) - 1);
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) {
            const __m512 x = widen_bf16x16(_mm256_maskz_loadu_epi16(m, a + r * lda + i));
            s[r] = _mm512_fmadd_ps(x, x, s[r]);
            _mm512_store_ps(xa + r * DG_HC_KC + i, x);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r)
        _mm512_storeu_ps(sq + r * sf, s[r]);
}

void dg_hc_convert_avx512(const uint16_t *a, int64_t lda, int rows, int64_t len, float *xa, float *sq, int64_t sf,
                          int first) {
    switch (rows) {
    case 4: convert_rows(a, lda, 4, len, xa, sq, sf, first); break;
    case 3: convert_rows(a, lda, 3, len, xa, sq, sf, first); break;
    case 2: convert_rows(a, lda, 2, len, xa, sq, sf, first); break;
    default: convert_rows(a, lda, 1, len, xa, sq, sf, first); break;
    }
}

/* The micro kernel for a fixed number of rows NR (constant after inlining). */
static inline __attribute__((always_inline)) void micro_rows(const float *xa, const int NR, int64_t len,
                                                            const float *pk, float *acc, int64_t sf, int first,
                                                            const uint16_t *pf) {
    __m512 c[R][C];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r)
#pragma GCC unroll 6
        for (int n = 0; n < C; ++n)
            c[r][n] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + r * sf + 16 * n);
    for (int64_t i = 0; i < len; i += 16) {
        if (pf) /* 16 BF16 per step: every line of pf[0, len) is hinted once or more */
            _mm_prefetch((const char *)(pf + i), _MM_HINT_T0);
        __m512 x[R];
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r)
            x[r] = _mm512_load_ps(xa + r * DG_HC_KC + i);
#pragma GCC unroll 6
        for (int n = 0; n < C; ++n) {
            const __m512 b = _mm512_load_ps(pk + n * DG_HC_KC + i);
#pragma GCC unroll 4
            for (int r = 0; r < NR; ++r)
                c[r][n] = _mm512_fmadd_ps(x[r], b, c[r][n]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r)
#pragma GCC unroll 6
        for (int n = 0; n < C; ++n)
            _mm512_storeu_ps(acc + r * sf + 16 * n, c[r][n]);
}

void dg_hc_micro_avx512(const float *xa, int rows, int64_t len, const float *pk, float *acc, int64_t sf,
                       int first, const uint16_t *pf) {
    switch (rows) {
    case 4: micro_rows(xa, 4, len, pk, acc, sf, first, pf); break;
    case 3: micro_rows(xa, 3, len, pk, acc, sf, first, pf); break;
    case 2: micro_rows(xa, 2, len, pk, acc, sf, first, pf); break;
    default: micro_rows(xa, 1, len, pk, acc, sf, first, pf); break;
    }
}

/*
 * Row sums of a 16 x 16 block (v[c] = the 16 partial sums of output c) by a transposing tree:
 * each level adds two halves of every output's remaining partial sums and packs two outputs'
 * halves into one vector, so 16 outputs take 15 adds and 30 shuffles. Every add combines
 * partial sums of one output only. Returns w with w[4q + j] = sum of output 4j + q.
 */
static inline __m512 reduce16(const __m512 v[16]) {
    __m512 x[8], y[4], z[2];
    for (int p = 0; p < 8; ++p) /* quadrants 0-1: output 2p (8 partials), 2-3: output 2p+1 */
        x[p] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0xEE));
    for (int p = 0; p < 4; ++p) /* quadrant q: output 4p + q (4 partials) */
        y[p] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * p], x[2 * p + 1], 0x88),
                             _mm512_shuffle_f32x4(x[2 * p], x[2 * p + 1], 0xDD));
    for (int p = 0; p < 2; ++p) /* quadrant q, lanes 0-1: output 8p + q; lanes 2-3: 8p + 4 + q */
        z[p] = _mm512_add_ps(_mm512_shuffle_ps(y[2 * p], y[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(y[2 * p], y[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* quadrant q, lane j: output 4j + q */
    return _mm512_add_ps(_mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

void dg_hc_finish_avx512(const float *st, float *out) {
    /* w[4q + j] holds output 4j + q: the same 4 x 4 transpose puts them in order. */
    const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    __m512 v[16];
    for (int c = 0; c < 16; ++c)
        v[c] = _mm512_loadu_ps(st + 16 * c);
    _mm512_storeu_ps(out, _mm512_permutexvar_ps(order, reduce16(v)));
    for (int c = 0; c < 16; ++c) /* outputs 16..24, the rest zero */
        v[c] = 16 + c <= DG_HC_NS ? _mm512_loadu_ps(st + 16 * (16 + c)) : _mm512_setzero_ps();
    _mm512_mask_storeu_ps(out + 16, (__mmask16)((1u << (DG_HC_NS + 1 - 16)) - 1),
                          _mm512_permutexvar_ps(order, reduce16(v)));
}
