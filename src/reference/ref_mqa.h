/*
 * ref_mqa.h - reference implementations of the lightning-indexer logits (SPEC 5): the plain
 * MQA logits over a contiguous KV and the paged-decoding variant. The entry points in
 * src/api/mqa_logits.c and src/api/paged_mqa_logits.c validate everything first; these
 * functions trust their arguments.
 *
 * Numerics (both kernels): each dequantized element is exact in double; per (query, head) the
 * dot product is summed in double in increasing d order, relu'd, multiplied by the weight, and
 * the heads are summed in double in increasing h order. FP8 multiplies the head sum by the
 * kv row's float32 scale (where DeepGEMM applies it); MXFP4 and MXFP8 scale each element by
 * its per-32 UE8M0 scale instead. The result is rounded once to the
 * logits dtype. Deterministic and independent of the thread count.
 */
#ifndef DG_REFERENCE_REF_MQA_H
#define DG_REFERENCE_REF_MQA_H

#include "core/internal.h"

/* Contiguous-KV problem. Logical head dim d; FP4 tensors hold d/2 bytes per row. */
typedef struct dg_mqa_problem {
    int64_t s, sk, h, d;
    int fp4;                       /* q, kv packed E2M1 (MXFP4) */
    int mx;                        /* per-32 UE8M0 scales, packed INT32 (MXFP4, MXFP8) */
    const dg_tensor *q;            /* [S, H, D] or [S, H, D/2] */
    const dg_tensor *q_sf;         /* mx: INT32 [S, H]; FP8: NULL */
    const dg_tensor *kv;           /* [SK, D] or [SK, D/2] */
    const dg_tensor *kv_sf;        /* FLOAT32 [SK] or INT32 [SK] */
    const dg_tensor *weights;      /* FLOAT32/BFLOAT16 [S, H] (FLOAT16 widened at the entry) */
    const int32_t *ks, *ke;        /* [S], contiguous */
    int clean_logits;
    int64_t max_seqlen_k;          /* 0: logits [S, SK]; > 0: compressed [S, max_seqlen_k] */
    const dg_tensor *logits;       /* FLOAT32/BFLOAT16, 2-D */
} dg_mqa_problem;

/* Fails only with DG_ERR_ALLOC, before writing anything. */
dg_status dg_ref_mqa_logits(const dg_mqa_problem *p);

/* Paged problem. Query row r = b * next_n + t. */
typedef struct dg_paged_mqa_problem {
    int64_t batch, next_n, h, d;
    int fp4, mx;                   /* as in dg_mqa_problem */
    const dg_tensor *q;            /* [B, next_n, H, D or D/2], contiguous */
    const dg_tensor *q_sf;         /* mx: INT32 [B, next_n, H] */
    const uint8_t *cache;          /* fused cache, see deepgemm.h */
    int64_t num_blocks, block_kv, block_stride; /* block_stride in bytes */
    const dg_tensor *weights;      /* [B * next_n, H] */
    const int32_t *context_lens;   /* [B] or [B, next_n], contiguous */
    int context_lens_2d;
    const int32_t *block_table;    /* row b at block_table + b * block_table_stride */
    int64_t block_table_stride;
    int64_t max_context_len;
    int clean_logits;
    const dg_tensor *logits;       /* [B * next_n, max_context_len] */
} dg_paged_mqa_problem;

/* Number of leading positions query row r may see (positions [0, n) are visible). */
int64_t dg_paged_visible_len(const dg_paged_mqa_problem *p, int64_t r);

dg_status dg_ref_paged_mqa_logits(const dg_paged_mqa_problem *p);

/* Sparse problem (contiguous or paged KV), resolved from the metadata by src/api. Row i sees
 * tokens [rows[2i], rows[2i + 1]); block j of row i starts at token slots[2(i N + j)]
 * (DG_SPARSE_NO_BLOCK: none) and, paged, lies in cache page slots[2(i N + j) + 1] at token
 * start % page_kv. Column j * sbkv + o of the logits is token start + o when in the row's range,
 * else -inf. */
#define DG_SPARSE_NO_BLOCK INT32_MIN
typedef struct dg_sparse_mqa_problem {
    int64_t s, h, d, nmsb, sbkv;
    int fp4, mx, paged;            /* fp4, mx as in dg_mqa_problem */
    const dg_tensor *q;            /* [S, (1,) H, D or D/2], contiguous */
    const dg_tensor *q_sf;         /* mx: INT32 [S, (1,) H] */
    const dg_tensor *weights;      /* [S, H] */
    const dg_tensor *kv, *kv_sf;   /* contiguous KV */
    const uint8_t *cache;          /* paged: fused cache, pages of page_kv tokens */
    int64_t page_kv, page_stride;  /* page_stride in bytes */
    int64_t num_pages;             /* paged: pages in the cache */
    const int32_t *rows;           /* [S][2] */
    const int32_t *slots;          /* [S][N][2] */
    const dg_tensor *logits;       /* [S, N * sbkv] */
} dg_sparse_mqa_problem;

/* Token `o` of block `j` of row `i`: its kv row bytes and 4-byte scale (FP8 float32 / MXFP4
 * and MXFP8 packed UE8M0), or 0 when the column is masked. */
int dg_sparse_token(const dg_sparse_mqa_problem *p, int64_t i, int64_t j, int64_t o, const uint8_t **row,
                    const uint8_t **sf);

/* The same for the block whose metadata is `slot` (a non-empty one), without the row's range
 * check: for callers that know some row sees the token (the fast path's shared blocks). */
void dg_sparse_token_at(const dg_sparse_mqa_problem *p, const int32_t *slot, int64_t o, const uint8_t **row,
                        const uint8_t **sf);

dg_status dg_ref_sparse_mqa_logits(const dg_sparse_mqa_problem *p);

#endif /* DG_REFERENCE_REF_MQA_H */
