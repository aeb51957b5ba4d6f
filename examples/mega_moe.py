"""A Mega MoE layer across processes, the way DeepGEMM's tests/test_mega_moe.py drives it, on CPU:

    PYTHONPATH=build/python python examples/mega_moe.py [--ranks 2] [--tokens 16]

Each rank (a process started by torch.multiprocessing.spawn, joined over gloo by init_dist)
places its tokens in its symmetric buffer and calls fp8_fp4_mega_moe; every rank then checks its
y against the single-process reference of the whole layer. Under mpirun or torchrun, pass the
mpi4py communicator or the gloo group instead (README, "Mega MoE across processes")."""
import argparse
import os
import socket

import torch
import torch.multiprocessing as mp

import deep_gemm_cpu as deep_gemm
from deep_gemm_cpu.utils import per_token_cast_to_fp4, per_token_cast_to_fp8
from deep_gemm_cpu.utils.dist import dist_print, init_dist

EXPERTS, TOPK, HIDDEN, INTERMEDIATE = 8, 2, 512, 256


def cast_weights(w):
    """[E, N, K] BF16 -> FP4 with per-1x32 UE8M0 scales in DeepGEMM's layout."""
    e, n, k = w.shape
    q, sf = torch.empty(e, n, k // 2, dtype=torch.int8), torch.empty(e, n, k // 32)
    for i in range(e):
        q[i], sf[i] = per_token_cast_to_fp4(w[i], use_ue8m0=True, gran_k=32)
    return q, deep_gemm.transform_sf_into_required_layout(sf, n, k, (1, 32), e)


def layer(num_ranks, num_tokens):
    """Every rank's inputs and the whole layer's weights, the same on every rank (seeded)."""
    g = torch.Generator().manual_seed(0)
    x = [torch.randn(num_tokens, HIDDEN, generator=g).bfloat16() for _ in range(num_ranks)]
    scores = [torch.randn(num_tokens, EXPERTS, generator=g) for _ in range(num_ranks)]
    routing = [torch.topk(s, TOPK, dim=-1) for s in scores]
    l1 = cast_weights(torch.randn(EXPERTS, 2 * INTERMEDIATE, HIDDEN, generator=g).bfloat16() / 16)
    l2 = cast_weights(torch.randn(EXPERTS, HIDDEN, INTERMEDIATE, generator=g).bfloat16() / 16)
    x = [per_token_cast_to_fp8(t, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True) for t in x]
    return x, [r.indices for r in routing], [r.values.sigmoid() for r in routing], l1, l2


def rank_main(local_rank, num_ranks, port, num_tokens):
    os.environ['MASTER_ADDR'], os.environ['MASTER_PORT'] = '127.0.0.1', str(port)
    torch.set_num_threads(1)
    deep_gemm.set_num_sms(max(1, (os.cpu_count() or 1) // num_ranks))
    rank, num_ranks, group = init_dist(local_rank, num_ranks)
    x, topk_idx, topk_weights, l1, l2 = layer(num_ranks, num_tokens)
    per_rank = EXPERTS // num_ranks
    mine = slice(rank * per_rank, (rank + 1) * per_rank)

    buffer = deep_gemm.get_symm_buffer_for_mega_moe(group, EXPERTS, num_tokens, TOPK, HIDDEN, INTERMEDIATE)
    l1_t, l2_t = deep_gemm.transform_weights_for_mega_moe((l1[0][mine], l1[1][mine]), (l2[0][mine], l2[1][mine]))
    buffer.x[:num_tokens].copy_(x[rank][0])
    buffer.x_sf[:num_tokens].copy_(x[rank][1])
    buffer.topk_idx[:num_tokens].copy_(topk_idx[rank])
    buffer.topk_weights[:num_tokens].copy_(topk_weights[rank])
    y = torch.empty(num_tokens, HIDDEN, dtype=torch.bfloat16)
    deep_gemm.fp8_fp4_mega_moe(y, l1_t, l2_t, buffer, activation_clamp=10.0)

    # The whole layer in this process, every rank's tokens: the reference's rank `rank`.
    ref = [torch.empty(num_tokens, HIDDEN, dtype=torch.bfloat16) for _ in range(num_ranks)]
    split = [(l1[0][r * per_rank:(r + 1) * per_rank], l1[1][r * per_rank:(r + 1) * per_rank])
             for r in range(num_ranks)]
    split2 = [(l2[0][r * per_rank:(r + 1) * per_rank], l2[1][r * per_rank:(r + 1) * per_rank])
              for r in range(num_ranks)]
    deep_gemm.fp8_fp4_mega_moe_reference(EXPERTS, x, topk_idx, topk_weights, split, split2, ref,
                                         activation_clamp=10.0)
    diff = float(deep_gemm.calc_diff(y.float(), ref[rank].float()))
    dist_print(f'rank {rank}/{num_ranks}: {num_tokens} tokens, calc_diff against the reference {diff:.2e}')
    assert diff < 1e-3, diff
    buffer.destroy()
    torch.distributed.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--ranks', type=int, default=2)
    parser.add_argument('--tokens', type=int, default=16)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(args.ranks, port, args.tokens), nprocs=args.ranks)


if __name__ == '__main__':
    main()
