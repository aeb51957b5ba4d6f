"""DeepGEMM 2.8's Mega Gate on CPU tensors: the BF16 router GEMM and the MoE top-k gate in one
call (the C library's dg_bf16_mega_gate; semantics in include/deepgemm.h, "mega-gate")."""
import sys

from . import _C
from ._alloc import allocate

get_bf16_mega_gate_config = _C.get_bf16_mega_gate_config


def _flags(t, name):
    """A bool [T] tensor/array as the library's uint8 view (zero copy); None stays None."""
    if t is None:
        return None
    torch = sys.modules.get('torch')
    if torch is not None and isinstance(t, torch.Tensor):
        if t.dtype != torch.bool:
            raise TypeError(f'bf16_mega_gate: argument {name!r} must be a bool tensor, got {t.dtype}')
        return t.view(torch.uint8)
    dtype = getattr(t, 'dtype', None)
    if dtype is None or str(dtype) != 'bool':
        raise TypeError(f'bf16_mega_gate: argument {name!r} must be a bool tensor, got {dtype}')
    return t.view('uint8')


def bf16_mega_gate(x, weight, num_topk, use_shared_as_routed, num_shared_experts,
                   routed_scaling_factor, ep_rank, scoring_func='identity', mask=None,
                   bias=None, image_bias=None, image_token_mask=None, fix_routing_mask=None,
                   to_physical_map=None, logical_count=None, unmapped_topk_idx=None,
                   force_random=None, out=None):
    """Router logits x @ weight.T (BF16, float32 accumulation), scores, top-k and weights.

    Returns (topk_idx [T, K'] int64, topk_weights [T, K'] float32) with K' = num_topk (+
    num_shared_experts when use_shared_as_routed); `out` gives them preallocated. Masks are
    bool [T]; unmapped_topk_idx [T, num_topk] int64 receives the logical routed experts (and
    is read for the fix_routing_mask tokens).
    """
    if out is None:
        if not hasattr(x, 'shape') or len(x.shape) != 2:
            raise ValueError("bf16_mega_gate: argument 'x' must be a 2-D tensor [num_tokens, hidden]")
        slots = int(num_topk) + (int(num_shared_experts) if use_shared_as_routed else 0)
        shape = (int(x.shape[0]), max(slots, 0))
        strides = (shape[1], 1)
        topk_idx = allocate(x, 'int64', shape, strides)
        topk_weights = allocate(x, 'float32', shape, strides)
    else:
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise TypeError("bf16_mega_gate: argument 'out' must be a (topk_idx, topk_weights) tuple")
        topk_idx, topk_weights = out
    _C.bf16_mega_gate(x, weight, num_topk, use_shared_as_routed, num_shared_experts,
                      routed_scaling_factor, ep_rank, scoring_func,
                      _flags(mask, 'mask'), bias, image_bias, _flags(image_token_mask, 'image_token_mask'),
                      _flags(fix_routing_mask, 'fix_routing_mask'), to_physical_map, logical_count,
                      unmapped_topk_idx, _flags(force_random, 'force_random'), topk_idx, topk_weights)
    return topk_idx, topk_weights
