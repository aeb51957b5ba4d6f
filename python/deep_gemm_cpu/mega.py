"""DeepGEMM's Mega MoE API. Its kernels exchange tokens between GPUs through a symmetric memory
buffer (NVSHMEM); deep_gemm_cpu has no such buffer, so these entry points raise
NotImplementedError instead of computing something else. The library does provide the
single-process references, bound as deep_gemm_cpu.fp8_fp4_mega_moe_reference and
deep_gemm_cpu.bf16_mega_moe_reference (every per-rank argument a list of R entries)."""

_WHY = ('DeepGEMM\'s Mega MoE needs a multi-GPU symmetric memory buffer, which deep_gemm_cpu '
        'does not implement yet (the fused expert-parallel kernel over MPI is planned); fp8_fp4_mega_moe_reference / bf16_mega_moe_reference compute '
        'the same for R ranks in one process')


def _missing(name):
    def fn(*args, **kwargs):
        raise NotImplementedError(f'deep_gemm_cpu.{name} is not implemented: {_WHY}')
    fn.__name__ = name
    fn.__qualname__ = name
    fn.__doc__ = f'Not implemented on CPU: {_WHY}.'
    return fn


class SymmBuffer:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError(f'deep_gemm_cpu.SymmBuffer is not implemented: {_WHY}')


get_symm_buffer_for_mega_moe = _missing('get_symm_buffer_for_mega_moe')
transform_weights_for_mega_moe = _missing('transform_weights_for_mega_moe')
fp8_fp4_mega_moe = _missing('fp8_fp4_mega_moe')
bf16_mega_moe = _missing('bf16_mega_moe')
get_token_alignment_for_mega_moe = _missing('get_token_alignment_for_mega_moe')
get_ring_limit_for_mega_moe = _missing('get_ring_limit_for_mega_moe')
get_symm_buffer_size_for_mega_moe = _missing('get_symm_buffer_size_for_mega_moe')
