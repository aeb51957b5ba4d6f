"""deep_gemm.utils on CPU: quantization helpers computed by the library (bit-identical to
DeepGEMM's torch formulas), integer helpers and the layout functions."""
from .._C import (
    per_token_cast_to_fp8,
    per_block_cast_to_fp8,
    per_channel_cast_to_fp8,
    per_custom_dims_cast_to_fp8,
    per_token_cast_to_fp4,
    cast_back_from_fp4,
    cast_back_from_fp8,
    transpose_packed_fp4,
    ceil_to_ue8m0,
    pack_ue8m0_to_int,
    unpack_ue8m0_from_int,
    calc_diff,
    get_tma_aligned_size,
    get_mn_major_tma_aligned_tensor,
    get_mn_major_tma_aligned_packed_ue8m0_tensor,
    get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor,
    set_mk_alignment_for_contiguous_layout,
    get_mk_alignment_for_contiguous_layout,
    get_theoretical_mk_alignment_for_contiguous_layout,
)

__all__ = [
    'ceil_div', 'align',
    'per_token_cast_to_fp8', 'per_block_cast_to_fp8', 'per_channel_cast_to_fp8',
    'per_custom_dims_cast_to_fp8', 'per_token_cast_to_fp4', 'cast_back_from_fp4',
    'cast_back_from_fp8', 'transpose_packed_fp4', 'ceil_to_ue8m0', 'pack_ue8m0_to_int',
    'unpack_ue8m0_from_int',
    'calc_diff', 'get_tma_aligned_size', 'get_mn_major_tma_aligned_tensor',
    'get_mn_major_tma_aligned_packed_ue8m0_tensor',
    'get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor',
    'set_mk_alignment_for_contiguous_layout', 'get_mk_alignment_for_contiguous_layout',
    'get_theoretical_mk_alignment_for_contiguous_layout',
    'get_m_alignment_for_contiguous_layout', 'get_k_alignment_for_contiguous_layout',
]


def ceil_div(x: int, y: int) -> int:
    return (x + y - 1) // y


def align(x: int, y: int) -> int:
    return ceil_div(x, y) * y


# Aliases, as DeepGEMM
get_m_alignment_for_contiguous_layout = get_mk_alignment_for_contiguous_layout
get_k_alignment_for_contiguous_layout = get_mk_alignment_for_contiguous_layout


# DeepGEMM's deep_gemm.utils.dist (init_dist, dist_print, uneven_all_gather) on CPU: gloo.
from . import dist
from .dist import init_dist, uneven_all_gather
