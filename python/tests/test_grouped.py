"""m-grouped (contiguous, psum, masked) and k-grouped GEMMs against float32 PyTorch math."""
import pytest
import torch

import deep_gemm_cpu as dg
from deep_gemm_cpu.utils import per_token_cast_to_fp8, per_block_cast_to_fp8, per_channel_cast_to_fp8
from conftest import calc_diff, align


def m_grouped_inputs(num_groups, ms, n, k, psum):
    """DeepGEMM's generate_m_grouped_contiguous: groups aligned to the mk alignment."""
    al = dg.get_mk_alignment_for_contiguous_layout()
    aligned = [align(x, al) for x in ms]
    m = sum(aligned)
    a = torch.randn(m, k, dtype=torch.bfloat16)
    b = torch.randn(num_groups, n, k, dtype=torch.bfloat16)
    layout = torch.empty(num_groups if psum else m, dtype=torch.int32)
    ref = torch.zeros(m, n)
    rows = []
    start = 0
    for g, (am, alm) in enumerate(zip(ms, aligned)):
        if psum:
            layout[g] = start + am
        else:
            layout[start:start + am] = g
            layout[start + am:start + alm] = -1
        a[start + am:start + alm] = 0
        ref[start:start + am] = a[start:start + am].float() @ b[g].float().t()
        rows.append((start, start + am))
        start += alm
    return m, a, b, layout, ref, rows


@pytest.mark.parametrize('psum', [False, True])
@pytest.mark.parametrize('nn', [False, True])
def test_m_grouped_bf16_contiguous(psum, nn):
    m, a, b, layout, ref, rows = m_grouped_inputs(3, [100, 0, 130], 64, 192, psum)
    d = torch.full((m, 64), 5.0, dtype=torch.bfloat16)
    if nn:
        dg.m_grouped_bf16_gemm_nn_contiguous(a, b.mT.contiguous(), d, layout, use_psum_layout=psum)
    else:
        dg.m_grouped_bf16_gemm_nt_contiguous(a, b, d, layout, use_psum_layout=psum,
                                             expected_m_for_psum_layout=100 if psum else None)
    for s, e in rows:
        assert calc_diff(d[s:e], ref[s:e]) < 1e-5
    if not psum:  # -1 padding rows are left untouched
        assert (d[layout == -1] == 5.0).all()


@pytest.mark.parametrize('psum', [False, True])
def test_m_grouped_fp8_contiguous(psum):
    m, a, b, layout, ref, rows = m_grouped_inputs(2, [128, 70], 128, 256, psum)
    qa = per_token_cast_to_fp8(a, use_ue8m0=False)
    qb = [per_block_cast_to_fp8(b[g], use_ue8m0=False) for g in range(2)]
    qb = (torch.stack([x[0] for x in qb]), torch.stack([x[1] for x in qb]))
    d = torch.empty(m, 128, dtype=torch.bfloat16)
    dg.m_grouped_fp8_gemm_nt_contiguous(qa, qb, d, layout, use_psum_layout=psum)
    for s, e in rows:
        assert calc_diff(d[s:e], ref[s:e]) < 1e-3


def test_m_grouped_masked():
    g, max_m, n, k = 3, 32, 64, 256
    a = torch.randn(g, max_m, k, dtype=torch.bfloat16)
    b = torch.randn(g, n, k, dtype=torch.bfloat16)
    masked_m = torch.tensor([32, 0, 17], dtype=torch.int32)
    ref = torch.einsum('gmk,gnk->gmn', a.float(), b.float())
    d = torch.full((g, max_m, n), 3.0, dtype=torch.bfloat16)
    dg.m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, expected_m=16)
    qa = [per_token_cast_to_fp8(a[i], use_ue8m0=False) for i in range(g)]
    qb = [per_block_cast_to_fp8(b[i], use_ue8m0=False) for i in range(g)]
    d8 = torch.full((g, max_m, n), 3.0, dtype=torch.bfloat16)
    dg.fp8_m_grouped_gemm_nt_masked((torch.stack([x[0] for x in qa]), torch.stack([x[1] for x in qa])),
                                    (torch.stack([x[0] for x in qb]), torch.stack([x[1] for x in qb])),
                                    d8, masked_m, 16)
    for i in range(g):
        mm = int(masked_m[i])
        if mm:
            assert calc_diff(d[i, :mm], ref[i, :mm]) < 1e-5
            assert calc_diff(d8[i, :mm], ref[i, :mm]) < 1e-3
        assert (d[i, mm:] == 3.0).all() and (d8[i, mm:] == 3.0).all()


def k_grouped_inputs(ks, m, n):
    a = [torch.randn(k, m, dtype=torch.bfloat16) for k in ks]
    b = [torch.randn(k, n, dtype=torch.bfloat16) for k in ks]
    c = torch.randn(len(ks), m, n)
    ref = c.clone()
    for g in range(len(ks)):
        if ks[g]:
            ref[g] += a[g].float().t() @ b[g].float()
    return a, b, c, ref


def test_k_grouped_bf16_tn():
    ks, m, n = [128, 0, 256], 32, 48
    a, b, c, ref = k_grouped_inputs(ks, m, n)
    d = torch.empty(3, m, n)
    dg.k_grouped_bf16_gemm_tn_contiguous(torch.cat(a), torch.cat(b), d, ks, torch.tensor(ks, dtype=torch.int32), c)
    assert calc_diff(d, ref) < 1e-5


def k_grouped_fp8(parts):
    qs = [per_channel_cast_to_fp8(p, use_ue8m0=False) for p in parts if p.size(0)]
    return torch.cat([q for q, _ in qs]), torch.cat([s for _, s in qs])


def test_k_grouped_fp8_tn_and_nt():
    ks, m, n = [256, 128], 32, 64
    a, b, c, ref = k_grouped_inputs(ks, m, n)
    qa, qb = k_grouped_fp8(a), k_grouped_fp8(b)
    layout = torch.tensor(ks, dtype=torch.int32)
    d = torch.empty(2, m, n)
    dg.k_grouped_fp8_gemm_tn_contiguous(qa, qb, d, ks, layout, c)
    assert calc_diff(d, ref) < 1e-3
    # `_nt`: each group as a K-major [mn, k_g] block, scales transposed (DeepGEMM passes sf.T)
    def k_major(q, sf, mn):
        blocks, s = [], 0
        for k in ks:
            blocks.append(q[s:s + k].t().contiguous().flatten())
            s += k
        return torch.cat(blocks), sf.t()
    d2 = c.clone()
    dg.k_grouped_fp8_gemm_nt_contiguous(k_major(*qa, m), k_major(*qb, n), d2, ks, layout, c=d2, recipe=(1, 1, 128))
    assert calc_diff(d2, ref) < 1e-3
