"""Dense GEMMs against float32 PyTorch math with DeepGEMM's thresholds (bf16: 1e-5, fp8: 1e-3,
one FP4 operand: 0.01, both: 0.02), zero-copy outputs, strided views, recipes, aliases."""
import pytest
import torch

import deep_gemm_cpu as dg
from deep_gemm_cpu.utils import per_token_cast_to_fp8, per_block_cast_to_fp8, per_token_cast_to_fp4
from conftest import calc_diff

SHAPES = [(1, 64, 128), (7, 96, 200), (128, 256, 512)]


def make_ab_for(layout, a, b):
    """a [M, K], b [N, K] -> the operands of the `layout` variant (views, no copies in torch)."""
    ta = a if layout[0] == 'n' else a.t().contiguous()   # tn/tt take A as [K, M]
    tb = b if layout[1] == 't' else b.t().contiguous()   # nn/tn take B as [K, N]
    return ta, tb


@pytest.mark.parametrize('layout', ['nt', 'nn', 'tn', 'tt'])
@pytest.mark.parametrize('out_dtype', [torch.bfloat16, torch.float32])
@pytest.mark.parametrize('m,n,k', SHAPES)
def test_bf16_gemm(layout, out_dtype, m, n, k):
    a, b = torch.randn(m, k, dtype=torch.bfloat16), torch.randn(n, k, dtype=torch.bfloat16)
    ref = a.float() @ b.float().t()
    ta, tb = make_ab_for(layout, a, b)
    d = torch.empty(m, n, dtype=out_dtype)
    ptr = d.data_ptr()
    getattr(dg, f'bf16_gemm_{layout}')(ta, tb, d)
    assert d.data_ptr() == ptr
    assert calc_diff(d, ref) < 1e-5
    if out_dtype == torch.float32:  # accumulate in place: c is d (DeepGEMM's form)
        c = torch.randn(m, n) * 32
        d.copy_(c)
        getattr(dg, f'bf16_gemm_{layout}')(ta, tb, d, c=d)
        assert calc_diff(d, ref + c) < 1e-5


def test_bf16_gemm_mn_major_views():
    a, b = torch.randn(64, 256, dtype=torch.bfloat16), torch.randn(96, 256, dtype=torch.bfloat16)
    am, bm = a.t().contiguous().t(), b.t().contiguous().t()  # MN-major views, as DeepGEMM's tests
    d = torch.empty(64, 96, dtype=torch.bfloat16)
    dg.bf16_gemm_nt(am, bm, d, compiled_dims='nk')
    assert calc_diff(d, a.float() @ b.float().t()) < 1e-5


def quant_a(a, gran_k=128, fp4=False, ue8m0=False, packed=False):
    if fp4:
        return per_token_cast_to_fp4(a, use_ue8m0=True, gran_k=gran_k, use_packed_ue8m0=packed)
    return per_token_cast_to_fp8(a, use_ue8m0=ue8m0, gran_k=gran_k, use_packed_ue8m0=packed)


@pytest.mark.parametrize('layout', ['nt', 'nn', 'tn', 'tt'])
@pytest.mark.parametrize('m,n,k', [(1, 64, 128), (33, 128, 384), (128, 256, 512)])
def test_fp8_gemm_legacy_recipe(layout, m, n, k):
    """Per-token A (1x128), per-block B (128x128), float32 scales: recipe deduced (1, 128, 128)."""
    a, b = torch.randn(m, k, dtype=torch.bfloat16), torch.randn(n, k, dtype=torch.bfloat16)
    ref = a.float() @ b.float().t()
    qa, sfa = per_token_cast_to_fp8(a, use_ue8m0=False)
    qb, sfb = per_block_cast_to_fp8(b, use_ue8m0=False)
    if layout[0] == 't':
        qa, sfa = qa.t().contiguous(), sfa.t().contiguous()
    if layout[1] == 'n':
        qb, sfb = qb.t().contiguous(), sfb.t().contiguous()
    d = torch.empty(m, n, dtype=torch.bfloat16)
    getattr(dg, f'fp8_gemm_{layout}')((qa, sfa), (qb, sfb), d)
    assert calc_diff(d, ref) < 1e-3
    c = torch.randn(m, n) * 32
    d32 = c.clone()
    getattr(dg, f'fp8_fp4_gemm_{layout}')((qa, sfa), (qb, sfb), d32, c=d32, disable_ue8m0_cast=True)
    assert calc_diff(d32, ref + c) < 1e-3


@pytest.mark.parametrize('fp4_a,fp4_b', [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize('gran_k', [32, 128])
def test_fp8_fp4_gemm_recipes(fp4_a, fp4_b, gran_k):
    m, n, k = 40, 128, 512
    a, b = torch.randn(m, k, dtype=torch.bfloat16), torch.randn(n, k, dtype=torch.bfloat16)
    ref = a.float() @ b.float().t()
    qa = quant_a(a, gran_k, fp4_a, ue8m0=True, packed=True)
    qb = quant_a(b, gran_k, fp4_b, ue8m0=True, packed=True)
    d = torch.empty(m, n, dtype=torch.bfloat16)
    dg.fp8_fp4_gemm_nt(qa, qb, d, recipe_a=(1, gran_k), recipe_b=(1, gran_k))
    limit = 0.02 if fp4_a and fp4_b else 0.01 if fp4_a or fp4_b else 0.001
    assert calc_diff(d, ref) < limit


def test_fp8_gemm_real_shape():
    """One of DeepSeek V3's projection shapes at a decoding batch."""
    m, n, k = 16, 2112, 7168
    a, b = torch.randn(m, k, dtype=torch.bfloat16), torch.randn(n, k, dtype=torch.bfloat16)
    qa, qb = per_token_cast_to_fp8(a, use_ue8m0=True), per_block_cast_to_fp8(b, use_ue8m0=True)
    d = torch.empty(m, n, dtype=torch.bfloat16)
    dg.fp8_gemm_nt(qa, qb, d, recipe=(1, 128, 128))
    assert calc_diff(d, a.float() @ b.float().t()) < 1e-3


def test_fp8_gemm_nt_skip_head_mid():
    heads, left, mid, right, m, k = 2, 32, 16, 64, 8, 256
    a = torch.randn(m, k, dtype=torch.bfloat16)
    b = torch.randn(heads * (left + right), k, dtype=torch.bfloat16)
    qa, qb = per_token_cast_to_fp8(a, use_ue8m0=False), per_block_cast_to_fp8(b, use_ue8m0=False)
    d = torch.full((m, heads * (left + mid + right)), 7.0, dtype=torch.bfloat16)
    dg.fp8_gemm_nt_skip_head_mid(qa, qb, d, (left, mid, right))
    full = (a.float() @ b.float().t()).view(m, heads, left + right)
    dv = d.view(m, heads, left + mid + right)
    assert calc_diff(dv[:, :, :left], full[:, :, :left]) < 1e-3
    assert calc_diff(dv[:, :, left + mid:], full[:, :, left:]) < 1e-3
    assert (dv[:, :, left:left + mid] == 7.0).all()


def test_aliases_are_deepgemm_names():
    assert dg.fp8_gemm_nt is dg.fp8_fp4_gemm_nt
    assert dg.m_grouped_fp8_gemm_nt_masked is dg.m_grouped_fp8_fp4_gemm_nt_masked
    assert dg.fp8_m_grouped_gemm_nt_masked is dg.m_grouped_fp8_gemm_nt_masked
    assert dg.bf16_m_grouped_gemm_nt_masked is dg.m_grouped_bf16_gemm_nt_masked


def test_empty_m_is_not_a_query():
    """Empty torch tensors have data_ptr() 0; the module must not mistake them for query forms."""
    a = torch.empty(0, 128, dtype=torch.bfloat16)
    b = torch.randn(2, 32, 128, dtype=torch.bfloat16)
    d = torch.empty(0, 32, dtype=torch.bfloat16)
    dg.bf16_gemm_nt(a, b[0], d)
    dg.m_grouped_bf16_gemm_nt_contiguous(a, b, d, torch.empty(0, dtype=torch.int32))
    q, sf = per_token_cast_to_fp8(torch.empty(0, 128), use_ue8m0=False)
    assert q.shape == (0, 128) and sf.shape == (0, 1)
