"""One rank of a Mega MoE run started by a launcher (used by test_mega_launchers.py):
    mpirun -n R python mega_rank_script.py mpi OUT_DIR      (an mpi4py communicator)
    torchrun --nproc-per-node R mega_rank_script.py torch OUT_DIR   (a gloo process group)
Every rank runs its share of test_mega_fused's global problem through fp8_fp4_mega_moe and saves
its y, recv stats and path report to OUT_DIR/rank<r>.pt."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deep_gemm_cpu as dg  # noqa: E402
from test_mega_fused import E, H, I, K, TMAX, _experts, _problem  # noqa: E402


def main(launcher, out_dir):
    torch.set_num_threads(1)
    if launcher == 'mpi':
        from mpi4py import MPI
        group = MPI.COMM_WORLD
        rank, R = group.Get_rank(), group.Get_size()
    else:
        import torch.distributed as dist
        dist.init_process_group('gloo')
        group = dist.new_group(list(range(dist.get_world_size())), backend='gloo')
        rank, R = dist.get_rank(), dist.get_world_size()
    splits = {1: [40], 2: [23, 17], 4: [9, 0, 20, 11]}[R]
    first, n = sum(splits[:rank]), splits[rank]
    x, topk_idx, topk_weights, l1, l2 = _problem('fp8xfp4')
    epr = E // R
    dg.set_print_paths(2)
    buf = dg.get_symm_buffer_for_mega_moe(group, E, TMAX, K, H, I)
    buf.x[:n].copy_(x[0][first:first + n])
    buf.x_sf[:n].copy_(x[1][first:first + n])
    buf.topk_idx[:n].copy_(topk_idx[first:first + n])
    buf.topk_weights[:n].copy_(topk_weights[first:first + n])
    y = torch.empty(n, H, dtype=torch.bfloat16)
    stats = torch.zeros(epr, dtype=torch.int32)
    dg.fp8_fp4_mega_moe(y, _experts(l1, rank * epr, (rank + 1) * epr), _experts(l2, rank * epr, (rank + 1) * epr),
                        buf, cumulative_local_expert_recv_stats=stats, activation_clamp=10.0)
    torch.save({'y': y, 'stats': stats, 'paths': dg.get_path_report()}, os.path.join(out_dir, f'rank{rank}.pt'))
    buf.destroy()
    if launcher == 'torch':
        dist.destroy_process_group()


if __name__ == '__main__':
    main(sys.argv[1], sys.argv[2])
