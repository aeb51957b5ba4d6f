"""deep_gemm.legacy on CPU: DeepGEMM's `*_tl` grouped BF16 GEMMs (Triton kernels kept for A100
upstream) with their names, arguments and results, computed by this library's grouped and dense
GEMMs. Arrays are torch CPU tensors or NumPy arrays, as everywhere in deep_gemm_cpu.

- ``m_grouped_bf16_gemm_{nt,nn}_contiguous_tl(a, b, d, m_indices)``: a [M, K], b [G, N, K]
  (``nn``: [G, K, N]), d [M, N] BF16, m_indices int32 [M]: row r of d = a[r] @ b[m_indices[r]].T;
  rows with m_indices[r] == -1 are written as zeros (as the Triton kernel writes them).
- ``a_fused_m_grouped_bf16_gemm_{nt,nn}_contiguous_tl(a, b, d, (m_indices, m_row_indices))``:
  row r of d = a[m_row_indices[r]] @ b[m_indices[r]].T; d has m_indices.numel() rows, a any
  number; a row index < 0 reads zeros, a group index < 0 writes zeros.
- ``{a,b}_fused_k_grouped_bf16_gemm_tn_contiguous_tl(a, b, d, (k_indices, k_start, k_end), acc)``:
  d [G, M, N] (float32, or BF16); group g sums k in [k_start[g], k_end[g]) of
  a[k_indices[k]]^T b[k] (``a_fused``: a [K', M], b [K, N]) or a[k]^T b[k_indices[k]]
  (``b_fused``: a [K, M], b [K', N]), K = k_indices.numel(), an index < 0 reading zeros; with
  ``acc`` the sums are added to d, otherwise they replace it (an empty group: d[g] = 0).

Differences from the GPU kernels, all in the direction of accepting more: the row counts need not
be multiples of get_mk_alignment_for_contiguous_layout() (the Triton kernels read one group index
per block of rows and do not mask K tails, so they need aligned layouts), group ranges are exact,
and results follow this library's float32 accumulation (deterministic, any thread count).
"""
from . import _C

__all__ = [
    'm_grouped_bf16_gemm_nt_contiguous_tl', 'm_grouped_bf16_gemm_nn_contiguous_tl',
    'a_fused_m_grouped_bf16_gemm_nt_contiguous_tl', 'a_fused_m_grouped_bf16_gemm_nn_contiguous_tl',
    'a_fused_k_grouped_bf16_gemm_tn_contiguous_tl', 'b_fused_k_grouped_bf16_gemm_tn_contiguous_tl',
]


def _is_torch(x):
    return type(x).__module__.startswith('torch')


def _dtype_name(x):
    return str(x.dtype).replace('torch.', '')


def _check(fn, name, x, ndim, dtypes):
    if not hasattr(x, 'shape') or not hasattr(x, 'dtype'):
        raise TypeError(f'{fn}: argument \'{name}\' must be a tensor, got {type(x).__name__}')
    if _dtype_name(x) not in dtypes:
        raise TypeError(f'{fn}: argument \'{name}\' must be {" or ".join(dtypes)}, got {_dtype_name(x)}')
    if len(x.shape) != ndim:
        raise ValueError(f'{fn}: argument \'{name}\' must be {ndim}-D, got shape {tuple(x.shape)}')


def _index(fn, name, x, n=None):
    _check(fn, name, x, 1, ('int32',))
    if n is not None and x.shape[0] != n:
        raise ValueError(f'{fn}: argument \'{name}\' must have {n} entries, got {x.shape[0]}')
    if _is_torch(x):
        return x.long()
    import numpy as np
    return np.asarray(x).astype(np.int64)


def _rows(x, idx):
    """x[idx] along dimension 0, zero rows where idx < 0 (a new array)."""
    if _is_torch(x):
        out = x[idx.clamp(min=0)]
        out[idx < 0] = 0
        return out
    import numpy as np
    out = x[np.maximum(idx, 0)]
    out[idx < 0] = 0
    return out


def _zero_rows(d, mask):
    if bool(mask.any()):
        d[mask] = 0


def _m_grouped(fn, a, b, d, m_indices, nn):
    _check(fn, 'a', a, 2, ('bfloat16',))
    _check(fn, 'b', b, 3, ('bfloat16',))
    _check(fn, 'd', d, 2, ('bfloat16',))
    idx = _index(fn, 'm_indices', m_indices, d.shape[0])
    if d.shape[0] == 0:
        return d
    call = _C.m_grouped_bf16_gemm_nn_contiguous if nn else _C.m_grouped_bf16_gemm_nt_contiguous
    call(a, b, d, m_indices)
    _zero_rows(d, idx < 0)  # padding rows: the library leaves them, the Triton kernel zeroes them


def m_grouped_bf16_gemm_nt_contiguous_tl(a, b, d, m_indices):
    """d[r] = a[r] @ b[m_indices[r]].T; a [M, K], b [G, N, K], d [M, N] BF16, m_indices int32 [M]."""
    _m_grouped('m_grouped_bf16_gemm_nt_contiguous_tl', a, b, d, m_indices, False)


def m_grouped_bf16_gemm_nn_contiguous_tl(a, b, d, m_indices):
    """The same with b [G, K, N]."""
    _m_grouped('m_grouped_bf16_gemm_nn_contiguous_tl', a, b, d, m_indices, True)


def _a_fused_m_grouped(fn, a, b, d, mappings, nn):
    if not isinstance(mappings, (tuple, list)) or len(mappings) != 2:
        raise TypeError(f'{fn}: argument \'mappings\' must be (m_indices, m_row_indices)')
    _check(fn, 'a', a, 2, ('bfloat16',))
    _check(fn, 'b', b, 3, ('bfloat16',))
    _check(fn, 'd', d, 2, ('bfloat16',))
    m_indices, m_row_indices = mappings
    idx = _index(fn, 'm_indices', m_indices, d.shape[0])
    rows = _index(fn, 'm_row_indices', m_row_indices, d.shape[0])
    if d.shape[0] == 0:
        return d
    if bool((rows >= a.shape[0]).any()):
        raise ValueError(f'{fn}: argument \'m_row_indices\' has entries past the {a.shape[0]} rows of \'a\'')
    gathered = _rows(a, rows)
    call = _C.m_grouped_bf16_gemm_nn_contiguous if nn else _C.m_grouped_bf16_gemm_nt_contiguous
    call(gathered, b, d, m_indices)
    _zero_rows(d, idx < 0)
    return d


def a_fused_m_grouped_bf16_gemm_nt_contiguous_tl(a, b, d, mappings):
    """d[r] = a[m_row_indices[r]] @ b[m_indices[r]].T with mappings = (m_indices, m_row_indices)."""
    return _a_fused_m_grouped('a_fused_m_grouped_bf16_gemm_nt_contiguous_tl', a, b, d, mappings, False)


def a_fused_m_grouped_bf16_gemm_nn_contiguous_tl(a, b, d, mappings):
    """The same with b [G, K, N]."""
    return _a_fused_m_grouped('a_fused_m_grouped_bf16_gemm_nn_contiguous_tl', a, b, d, mappings, True)


def _k_grouped(fn, a, b, d, handle, acc, fused_a):
    if not isinstance(handle, (tuple, list)) or len(handle) != 3:
        raise TypeError(f'{fn}: argument \'handle\' must be (k_indices, k_start, k_end)')
    _check(fn, 'a', a, 2, ('bfloat16',))
    _check(fn, 'b', b, 2, ('bfloat16',))
    _check(fn, 'd', d, 3, ('float32', 'bfloat16'))
    k_indices, k_start, k_end = handle
    kidx = _index(fn, 'k_indices', k_indices)
    starts = [int(x) for x in _index(fn, 'k_start', k_start, d.shape[0])]
    ends = [int(x) for x in _index(fn, 'k_end', k_end, d.shape[0])]
    plain, fused = (b, a) if fused_a else (a, b)
    if plain.shape[0] != kidx.shape[0]:
        raise ValueError(f'{fn}: argument \'k_indices\' must have one entry per row of '
                         f'\'{"b" if fused_a else "a"}\' ({plain.shape[0]}), got {kidx.shape[0]}')
    if d.shape[1] != a.shape[1] or d.shape[2] != b.shape[1]:
        raise ValueError(f'{fn}: argument \'d\' must be [G, {a.shape[1]}, {b.shape[1]}], got {tuple(d.shape)}')
    if bool((kidx >= fused.shape[0]).any()):
        raise ValueError(f'{fn}: argument \'k_indices\' has entries past the {fused.shape[0]} rows of '
                         f'\'{"a" if fused_a else "b"}\'')
    for g, (s, e) in enumerate(zip(starts, ends)):
        if s < e and (s < 0 or e > kidx.shape[0]):
            raise ValueError(f'{fn}: group {g} spans [{s}, {e}), outside the {kidx.shape[0]} rows of k_indices')
    gathered = _rows(fused, kidx)
    ga, gb = (gathered, b) if fused_a else (a, gathered)
    for g, (s, e) in enumerate(zip(starts, ends)):
        s, e = (s, e) if s < e else (0, 0)  # an empty group: K = 0
        dg = d[g]
        _C.bf16_gemm_tn(ga[s:e], gb[s:e], dg, c=dg if acc else None)


def a_fused_k_grouped_bf16_gemm_tn_contiguous_tl(a, b, d, handle, acc):
    """d[g] (+)= sum over k in [k_start[g], k_end[g]) of a[k_indices[k]]^T b[k]."""
    _k_grouped('a_fused_k_grouped_bf16_gemm_tn_contiguous_tl', a, b, d, handle, acc, True)


def b_fused_k_grouped_bf16_gemm_tn_contiguous_tl(a, b, d, handle, acc):
    """d[g] (+)= sum over k in [k_start[g], k_end[g]) of a[k]^T b[k_indices[k]]."""
    _k_grouped('b_fused_k_grouped_bf16_gemm_tn_contiguous_tl', a, b, d, handle, acc, False)
