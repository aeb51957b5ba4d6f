"""DeepGEMM's deep_gemm.utils.dist on CPU: the helpers its multi-process tests and benchmarks
import. Process groups use the gloo backend (torch.distributed's CPU backend) instead of NCCL;
tensors stay on the CPU. Launch as upstream does (torch.multiprocessing.spawn, or torchrun with
MASTER_ADDR / MASTER_PORT / WORLD_SIZE / RANK describing the nodes)."""
import os
from typing import Optional, Tuple

import torch
import torch.distributed as dist

_local_rank = None


def init_dist(local_rank: int, num_local_ranks: int) -> Tuple[int, int, 'dist.ProcessGroup']:
    """Joins the job as rank node_rank * num_local_ranks + local_rank of
    WORLD_SIZE (nodes) * num_local_ranks, over tcp://MASTER_ADDR:MASTER_PORT (defaults
    127.0.0.1:8361, one node), as DeepGEMM's init_dist; returns (rank, world size, group)."""
    global _local_rank
    ip = os.getenv('MASTER_ADDR', '127.0.0.1')
    port = int(os.getenv('MASTER_PORT', '8361'))
    num_nodes = int(os.getenv('WORLD_SIZE', 1))
    node_rank = int(os.getenv('RANK', 0))
    _local_rank = local_rank
    dist.init_process_group(backend='gloo', init_method=f'tcp://{ip}:{port}',
                            world_size=num_nodes * num_local_ranks,
                            rank=node_rank * num_local_ranks + local_rank)
    group = dist.new_group(list(range(num_local_ranks * num_nodes)), backend='gloo')
    return dist.get_rank(), dist.get_world_size(), group


def dist_print(s: str = '', once_in_node: bool = False) -> None:
    """print on every rank (or local rank 0 only), then a barrier, as DeepGEMM's."""
    if not once_in_node or (_local_rank or 0) == 0:
        print(s, flush=True)
    dist.barrier()


def uneven_all_gather(tensor: torch.Tensor, dim: int = 0,
                      group: Optional['dist.ProcessGroup'] = None) -> torch.Tensor:
    """Concatenation along `dim` of every rank's tensor, whose sizes along `dim` may differ."""
    world_size = dist.get_world_size(group)
    sizes = [torch.zeros(1, dtype=torch.long) for _ in range(world_size)]
    dist.all_gather(sizes, torch.tensor([tensor.shape[dim]], dtype=torch.long), group=group)
    sizes = [int(s.item()) for s in sizes]
    longest = max(sizes)
    padded = tensor.contiguous()
    if tensor.shape[dim] < longest:
        pad_shape = list(tensor.shape)
        pad_shape[dim] = longest - tensor.shape[dim]
        padded = torch.cat([padded, torch.zeros(pad_shape, dtype=tensor.dtype)], dim=dim)
    # gloo's all_gather has no float8 / bool support: move the bytes as uint8
    as_bytes = padded.dtype in (torch.float8_e4m3fn, torch.bool) or padded.dtype.itemsize == 1
    wire = padded.view(torch.uint8) if as_bytes else padded
    gathered = [torch.empty_like(wire) for _ in range(world_size)]
    dist.all_gather(gathered, wire, group=group)
    if as_bytes:
        gathered = [g.view(padded.dtype) for g in gathered]
    return torch.cat([torch.narrow(g, dim, 0, sizes[i]) for i, g in enumerate(gathered)], dim=dim)
