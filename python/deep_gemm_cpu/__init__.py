"""deep_gemm_cpu: DeepGEMM's Python API (``deep_gemm``) on CPU tensors.

``import deep_gemm_cpu as deep_gemm`` and pass torch CPU tensors (or NumPy arrays, with
ml_dtypes for bfloat16 / float8_e4m3fn) where DeepGEMM takes CUDA tensors. Functions, argument
names, defaults and the (data, scales) tuples are DeepGEMM's; outputs land in the tensors you
pass, and functions that return new tensors in DeepGEMM return new tensors here.
"""
from . import _C
from ._C import (
    # Runtime settings
    set_num_sms, get_num_sms,
    set_tc_util, get_tc_util,
    set_ignore_compile_dims, get_ignore_compile_dims,
    set_block_size_multiple_of, get_block_size_multiple_of,
    set_pdl, get_pdl,
    use_deterministic_algorithms, get_deterministic_algorithms,
    set_mk_alignment_for_contiguous_layout,
    get_mk_alignment_for_contiguous_layout,
    get_theoretical_mk_alignment_for_contiguous_layout,
    # CPU-only extras
    set_backend, get_backend, get_isa, set_isa,
    set_print_paths, get_print_paths, get_path_report, clear_path_report,
    # CPU extras: weights packed once (PackedB) for the `_nt` GEMMs, passed in place of b
    pack_b, PackedB,
    # cuBLASLt GEMMs: plain GEMMs on the CPU engine (BF16, unscaled FP8, float32 operands)
    cublaslt_gemm_nt, cublaslt_gemm_nn,
    cublaslt_gemm_tn, cublaslt_gemm_tt, cublaslt_nvfp4_gemm_nt, batched_syrk, batched_symm,
    # FP8 FP4 GEMMs
    fp8_fp4_gemm_nt, fp8_fp4_gemm_nn,
    fp8_fp4_gemm_tn, fp8_fp4_gemm_tt,
    m_grouped_fp8_fp4_gemm_nt_contiguous,
    m_grouped_fp8_fp4_gemm_nn_contiguous,
    m_grouped_fp8_fp4_gemm_nt_masked,
    # FP8 GEMMs
    fp8_gemm_nt, fp8_gemm_nn,
    fp8_gemm_tn, fp8_gemm_tt,
    fp8_gemm_nt_skip_head_mid,
    m_grouped_fp8_gemm_nt_contiguous,
    m_grouped_fp8_gemm_nn_contiguous,
    m_grouped_fp8_gemm_nt_masked,
    k_grouped_fp8_gemm_nt_contiguous,
    k_grouped_fp8_gemm_tn_contiguous,
    # DeepGEMM 2.8's k-grouped FP4 GEMM (its own kernel: exact integer block dot products per group)
    k_grouped_fp4_gemm_nt_contiguous,
    # BF16 GEMMs
    bf16_gemm_nt, bf16_gemm_nn,
    bf16_gemm_tn, bf16_gemm_tt,
    m_grouped_bf16_gemm_nt_contiguous,
    m_grouped_bf16_gemm_nn_contiguous,
    m_grouped_bf16_gemm_nt_masked,
    k_grouped_bf16_gemm_tn_contiguous,
    # Einsum kernels
    einsum,
    fp8_einsum,
    # Attention kernels
    fp8_fp4_mqa_logits,
    get_mqa_logits_metadata,
    get_paged_mqa_logits_metadata,
    get_sparse_mqa_logits_metadata,
    get_paged_sparse_mqa_logits_metadata,
    fp8_fp4_sparse_mqa_logits,
    fp8_fp4_paged_sparse_mqa_logits,
    fp8_fp4_paged_mqa_logits,
    fp8_mqa_logits,
    fp8_paged_mqa_logits,
    # Hyperconnection kernels
    mega_mhc,
    tf32_hc_prenorm_gemm,
    # Layout kernels
    transform_sf_into_required_layout,
    # CPU extras: the single-process Mega MoE references (R ranks as lists)
    fp8_fp4_mega_moe_reference,
    bf16_mega_moe_reference,
)

# FP4 names (DeepGEMM 2.8): the very same functions as the fp8_fp4 ones, as in DeepGEMM
fp4_gemm_nt = fp8_fp4_gemm_nt
m_grouped_fp4_gemm_nt_contiguous = m_grouped_fp8_fp4_gemm_nt_contiguous
m_grouped_fp4_gemm_nt_masked = m_grouped_fp8_fp4_gemm_nt_masked

# Legacy aliases, as DeepGEMM
fp8_m_grouped_gemm_nt_masked = m_grouped_fp8_gemm_nt_masked
bf16_m_grouped_gemm_nt_masked = m_grouped_bf16_gemm_nt_masked

# MegaGate kernels (DeepGEMM 2.8): router GEMM + MoE top-k gate
from .gate import bf16_mega_gate, get_bf16_mega_gate_config

# Mega MoE: expert-parallel ranks as processes over a shared-memory symmetric buffer
from .mega import (
    SymmBuffer,
    get_symm_buffer_for_mega_moe,
    transform_weights_for_mega_moe,
    TransformedWeights,
    fp8_fp4_mega_moe,
    bf16_mega_moe,
    fp8_mega_moe,
    fp4_fp4_mega_moe,
    get_block_m_for_mega_moe,
    get_token_alignment_for_mega_moe,
    get_ring_limit_for_mega_moe,
    SM90SymmBuffer,
    get_symm_buffer_for_sm90_mega_moe,
    transform_weights_for_mega_moe_sm90,
    get_symm_buffer_size_for_mega_moe,
)

from . import testing
from . import utils
from .utils import *

# DeepGEMM's legacy `*_tl` grouped GEMMs (Triton kernels for A100 upstream), on the CPU engine
from . import legacy


def init(library_root_path=None, cuda_home_path_by_python=None):
    """DeepGEMM's JIT initialisation; nothing to do on a CPU."""
    _C.init(library_root_path, cuda_home_path_by_python)


__version__ = _C.library_version
