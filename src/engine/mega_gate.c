/*
 * mega_gate.c - the fast dg_bf16_mega_gate (semantics in deepgemm.h, "mega-gate").
 *
 * Tokens are taken in chunks of DG_GATE_BLOCK_TOKENS. For each chunk the BF16 engine computes
 * the logits [chunk, E] into a float32 scratch (it streams the router weights once per chunk at
 * memory speed; for decoding sizes there is one chunk, so the weights are read once), then the
 * tokens are ranked in parallel (OpenMP), each by one thread with a one-pass top-k.
 * Determinism: the engine's per-element chain depends on neither M nor the thread count
 * (engine.h), and a token's gate reads only its own logits row, so a token's outputs are the
 * same for any T, chunk position and thread count; the order (chains per accumulation block,
 * engine.h) is the reference's, so the bits are the reference's (deepgemm.h, "Numerics", for the ISA caveats).
 */
#include "mega_gate.h"

#include "engine.h"
#include "../kernels/gate_kernels.h"

#include <math.h>

#define DG_GATE_BLOCK_TOKENS 1024 /* scratch of at most 2 MiB (E <= 512); the weights are re-read
                                     once per 1024 tokens, a small cost next to their FLOPs */

int64_t dg_gate_block_tokens(int64_t tokens) {
    return tokens < DG_GATE_BLOCK_TOKENS ? tokens : DG_GATE_BLOCK_TOKENS;
}

/* One pass over the ranks keeping the best K sorted (best first); an expert enters only when
 * strictly better than the current last, and after equal ones, so ties keep the lower index. */
static void gate_topk_one_pass(const float *rank, int64_t experts, int topk, int *sel) {
    float best[DG_GATE_MAX_SLOTS];
    int count = 0;
    for (int64_t e = 0; e < experts; ++e) {
        const float r = rank[e];
        if (!(r > -INFINITY) || (count == topk && !(r > best[count - 1])))
            continue;
        int pos = count < topk ? count : topk - 1;
        while (pos > 0 && r > best[pos - 1]) {
            best[pos] = best[pos - 1];
            sel[pos] = sel[pos - 1];
            --pos;
        }
        best[pos] = r;
        sel[pos] = (int)e;
        if (count < topk)
            ++count;
    }
    for (int j = count; j < topk; ++j)
        sel[j] = 0; /* DeepGEMM's clamp of an empty slot */
}

dg_gate_score_row_fn dg_gate_score_row_for(dg_isa isa) {
#if DG_GATE_HAVE_X86
    if (isa >= DG_ISA_AVX512)
        return dg_gate_score_row_avx512;
    if (isa >= DG_ISA_AVX2)
        return dg_gate_score_row_avx2;
#else
    (void)isa;
#endif
    return dg_gate_score_row_ref;
}

dg_status dg_engine_mega_gate(const dg_gate_problem *p) {
    const int64_t block = dg_gate_block_tokens(p->tokens), e_count = p->experts;
    float *logits = dg_malloc((size_t)block * (size_t)e_count * sizeof(float));
    if (!logits)
        return dg_fail(DG_ERR_ALLOC, "cannot allocate the %lld x %lld logits scratch", (long long)block,
                       (long long)e_count);
    static const dg_dtype kBf16[1] = {DG_BFLOAT16};
    const dg_tensor w = dg_tensor_2d((void *)p->weight, DG_BFLOAT16, e_count, p->hidden);
    dg_operand ow;
    dg_status st = dg_operand_init(&ow, "weight", &w, 0, kBf16, 1);
    const int threads = dg_num_threads();
    const dg_gate_score_row_fn score_row = dg_gate_score_row_for(dg_get_isa());
    for (int64_t t0 = 0; st == DG_OK && t0 < p->tokens; t0 += block) {
        const int64_t rows = p->tokens - t0 < block ? p->tokens - t0 : block;
        const dg_tensor x = dg_tensor_2d((void *)(p->x + t0 * p->hidden), DG_BFLOAT16, rows, p->hidden);
        const dg_tensor d = dg_tensor_2d(logits, DG_FLOAT32, rows, e_count);
        dg_operand ox;
        st = dg_operand_init(&ox, "x", &x, 0, kBf16, 1);
        if (st == DG_OK)
            st = dg_engine_gemm(&ox, &ow, &d, NULL);
        if (st != DG_OK)
            break;
        const int team = rows < threads ? (int)rows : threads;
#pragma omp parallel for num_threads(team) schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
            float rank[DG_GATE_MAX_EXPERTS];
            dg_gate_token(p, t0 + r, logits + r * e_count, rank, gate_topk_one_pass, score_row);
        }
    }
    dg_free(logits);
    if (st == DG_ERR_UNSUPPORTED) /* BF16 operands are always the engine's: not expected */
        return dg_fail(DG_ERR_INTERNAL, "the BF16 engine declined the router GEMM");
    return st;
}
