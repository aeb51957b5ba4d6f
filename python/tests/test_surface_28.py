"""DeepGEMM 2.8's names: cublaslt_gemm_*, the FP4 aliases, deep_gemm.legacy's `*_tl` GEMMs and the
testing helpers; every name exists, each function against torch, bad input names the argument."""
import os

import numpy as np
import pytest
import torch

import deep_gemm_cpu as dg
from deep_gemm_cpu.utils import per_token_cast_to_fp4
from conftest import calc_diff, FakeCudaTensor

LAYOUTS = ['nt', 'nn', 'tn', 'tt']
SHAPES = [(1, 1, 1), (7, 13, 33), (65, 40, 130)]


def test_every_28_name_exists():
    for name in ['cublaslt_gemm_nt', 'cublaslt_gemm_nn', 'cublaslt_gemm_tn', 'cublaslt_gemm_tt',
                 'fp4_gemm_nt', 'm_grouped_fp4_gemm_nt_contiguous', 'm_grouped_fp4_gemm_nt_masked',
                 'k_grouped_fp4_gemm_nt_contiguous', 'legacy', 'batched_syrk', 'batched_symm', 'cublaslt_nvfp4_gemm_nt',
                 'bf16_mega_gate', 'get_bf16_mega_gate_config', 'mega_mhc', 'get_mqa_logits_metadata',
                 'get_sparse_mqa_logits_metadata', 'get_paged_sparse_mqa_logits_metadata',
                 'fp8_fp4_sparse_mqa_logits', 'fp8_fp4_paged_sparse_mqa_logits']:
        assert hasattr(dg, name), name
    for name in ['m_grouped_bf16_gemm_nt_contiguous_tl', 'm_grouped_bf16_gemm_nn_contiguous_tl',
                 'a_fused_m_grouped_bf16_gemm_nt_contiguous_tl', 'a_fused_m_grouped_bf16_gemm_nn_contiguous_tl',
                 'a_fused_k_grouped_bf16_gemm_tn_contiguous_tl', 'b_fused_k_grouped_bf16_gemm_tn_contiguous_tl']:
        assert callable(getattr(dg.legacy, name)), name
    for name in ['get_arch_major', 'test_filter', 'ignore_env', 'assert_bitwise_equal']:
        assert callable(getattr(dg.testing, name)), name
    # As in DeepGEMM, the FP4 names are the fp8_fp4 functions themselves
    assert dg.fp4_gemm_nt is dg.fp8_fp4_gemm_nt
    assert dg.m_grouped_fp4_gemm_nt_contiguous is dg.m_grouped_fp8_fp4_gemm_nt_contiguous
    assert dg.m_grouped_fp4_gemm_nt_masked is dg.m_grouped_fp8_fp4_gemm_nt_masked


# ---- cuBLASLt GEMMs --------------------------------------------------------------------------

def operands(layout, a, b):
    """a [M, K], b [N, K] -> the layout's operands (`t` A and `n` B as [K, *] contiguous)."""
    return (a if layout[0] == 'n' else a.t().contiguous()), (b if layout[1] == 't' else b.t().contiguous())


@pytest.mark.parametrize('layout', LAYOUTS)
@pytest.mark.parametrize('out_dtype', [torch.bfloat16, torch.float32])
@pytest.mark.parametrize('m,n,k', SHAPES)
def test_cublaslt_bf16(layout, out_dtype, m, n, k):
    a, b = torch.randn(m, k, dtype=torch.bfloat16), torch.randn(n, k, dtype=torch.bfloat16)
    ta, tb = operands(layout, a, b)
    ref = a.double() @ b.double().t()
    d = torch.empty(m, n, dtype=out_dtype)
    getattr(dg, f'cublaslt_gemm_{layout}')(ta, tb, d)
    assert calc_diff(d, ref) < 1e-5
    # the same engine as bf16_gemm_*: the same bits
    d2 = torch.empty_like(d)
    getattr(dg, f'bf16_gemm_{layout}')(ta, tb, d2)
    dg.testing.assert_bitwise_equal(d, d2, layout)
    # accumulate: c separate, and c = d (DeepGEMM's form)
    c = (torch.randn(m, n) * 4).to(out_dtype)
    getattr(dg, f'cublaslt_gemm_{layout}')(ta, tb, d, c=c)
    assert calc_diff(d, ref + c.double()) < 1e-5
    d.copy_(c)
    getattr(dg, f'cublaslt_gemm_{layout}')(ta, tb, d, d)
    assert calc_diff(d, ref + c.double()) < 1e-5


@pytest.mark.parametrize('layout', LAYOUTS)
@pytest.mark.parametrize('m,n,k', SHAPES)
def test_cublaslt_fp8_and_fp32(layout, m, n, k):
    # FP8: the codes' values, unscaled
    a8 = (torch.randn(m, k) * 8).to(torch.float8_e4m3fn)
    b8 = (torch.randn(n, k) * 8).to(torch.float8_e4m3fn)
    ta, tb = operands(layout, a8, b8)
    ref = a8.double() @ b8.double().t()
    for out_dtype in (torch.bfloat16, torch.float32):
        d = torch.empty(m, n, dtype=out_dtype)
        getattr(dg, f'cublaslt_gemm_{layout}')(ta, tb, d)
        assert calc_diff(d, ref) < 1e-5
    # FLOAT32: the exact sum rounded once (the reference kernel)
    a, b = torch.randn(m, k), torch.randn(n, k)
    ta, tb = operands(layout, a, b)
    c = torch.randn(m, n)
    d = torch.empty(m, n)
    getattr(dg, f'cublaslt_gemm_{layout}')(ta, tb, d, c)
    assert torch.equal(d, (c.double() + a.double() @ b.double().t()).float())


def test_cublaslt_views_numpy_and_k0():
    a, b = torch.randn(9, 48, dtype=torch.bfloat16), torch.randn(20, 48, dtype=torch.bfloat16)
    d = torch.empty(9, 20)
    dg.cublaslt_gemm_nt(a.t().contiguous().t(), b[:, :48], d)  # MN-major A view
    assert calc_diff(d, a.float() @ b.float().t()) < 1e-6
    an, bn = np.asarray(a.float()), np.asarray(b.float())
    dn = np.zeros((9, 20), dtype=np.float32)
    dg.cublaslt_gemm_nt(an, bn, dn)
    assert np.array_equal(dn, (an.astype(np.float64) @ bn.T.astype(np.float64)).astype(np.float32))
    # K = 0: d = c (or 0)
    d = torch.full((3, 4), 7.0)
    dg.cublaslt_gemm_nt(torch.empty(3, 0, dtype=torch.bfloat16), torch.empty(4, 0, dtype=torch.bfloat16), d)
    assert torch.equal(d, torch.zeros(3, 4))


def test_cublaslt_bad_input():
    a, b = torch.randn(4, 16, dtype=torch.bfloat16), torch.randn(6, 16, dtype=torch.bfloat16)
    d = torch.full((4, 6), 5.0)
    with pytest.raises(TypeError, match=r"cublaslt_gemm_nt.*'a'.*'b'.*same dtype"):
        dg.cublaslt_gemm_nt(a, b.float(), d)
    with pytest.raises(ValueError, match=r"cublaslt_gemm_tn.*'a' and 'b' disagree on K"):
        dg.cublaslt_gemm_tn(a.t(), torch.randn(15, 6, dtype=torch.bfloat16), d)
    with pytest.raises(TypeError, match=r"cublaslt_gemm_nt.*'d' must be FLOAT32"):
        dg.cublaslt_gemm_nt(a.float(), b.float(), d.bfloat16())
    with pytest.raises(ValueError, match=r"cublaslt_gemm_nn.*'d'"):
        dg.cublaslt_gemm_nn(a, b.t(), torch.empty(4, 5))
    with pytest.raises(TypeError, match=r"cublaslt_gemm_tt.*'c'"):
        dg.cublaslt_gemm_tt(a.t(), b, d, c=d.bfloat16())
    with pytest.raises(TypeError, match=r"cublaslt_gemm_nt.*'a'"):
        dg.cublaslt_gemm_nt(a.to(torch.int8), b, d)  # packed FP4 needs scales: fp8_fp4_gemm_nt
    with pytest.raises(ValueError, match=r"cublaslt_gemm_nt.*'a'"):
        dg.cublaslt_gemm_nt(FakeCudaTensor(a), b, d)
    with pytest.raises(TypeError):
        dg.cublaslt_gemm_nt(a, b, d, compiled_dims='nk')  # DeepGEMM's cuBLASLt calls take no such keyword
    assert torch.equal(d, torch.full((4, 6), 5.0))


# ---- FP4 names ---------------------------------------------------------------------------------

def test_fp4_aliases_compute_fp4():
    m, n, k, g = 5, 32, 128, 2
    a = per_token_cast_to_fp4(torch.randn(m * g, k, dtype=torch.bfloat16), use_ue8m0=True, gran_k=32,
                              use_packed_ue8m0=True)
    w = [per_token_cast_to_fp4(torch.randn(n, k, dtype=torch.bfloat16), use_ue8m0=True, gran_k=32,
                               use_packed_ue8m0=True) for _ in range(g)]
    b = (torch.stack([x[0] for x in w]), torch.stack([x[1] for x in w]))
    recipes = dict(recipe_a=(1, 32), recipe_b=(1, 32))
    d, d2 = torch.empty(m * g, n, dtype=torch.bfloat16), torch.empty(m * g, n, dtype=torch.bfloat16)
    dg.fp4_gemm_nt(a, w[0], d, **recipes)
    dg.fp8_fp4_gemm_nt(a, w[0], d2, **recipes)
    dg.testing.assert_bitwise_equal(d, d2)
    layout = torch.arange(m * g, dtype=torch.int32) // m
    dg.m_grouped_fp4_gemm_nt_contiguous(a, b, d, layout, **recipes)
    dg.testing.assert_bitwise_equal(d[:m], d2[:m])  # group 0 = the dense call with w[0]
    a3 = (a[0].view(g, m, k // 2), a[1].view(g, m, -1))
    d3 = torch.empty(g, m, n, dtype=torch.bfloat16)
    dg.m_grouped_fp4_gemm_nt_masked(a3, b, d3, torch.tensor([m, m], dtype=torch.int32), m, **recipes)
    dg.testing.assert_bitwise_equal(d3.view(m * g, n), d)


def k_grouped_fp4_inputs(logical_ks, m, n, alignment, psum):
    """As DeepGEMM 2.8's generate_k_grouped_contiguous for FP4: per group, x [k, mn] zero-padded to
    its aligned K, cast with per_token_cast_to_fp4 along K (gran_k 32), data [mn, sum_k / 2] and
    scales [sum_g aligned_k_g / 32, mn]."""
    host_ks = [(k + alignment - 1) // alignment * alignment for k in logical_ks]
    ends, prev = [], 0
    for k in logical_ks:
        prev = ((prev + alignment - 1) // alignment * alignment if psum else prev) + k
        ends.append(prev)
        if not psum:
            prev = sum(host_ks[:len(ends)])
    total = sum(host_ks)
    a, b = torch.zeros(total, m, dtype=torch.bfloat16), torch.zeros(total, n, dtype=torch.bfloat16)
    starts = []
    for i, k in enumerate(logical_ks):
        start = (ends[i] - k) if psum else sum(host_ks[:i])
        starts.append(start)
        a[start:start + k] = torch.randn(k, m, dtype=torch.bfloat16)
        b[start:start + k] = torch.randn(k, n, dtype=torch.bfloat16)

    def cast(x, mn):
        data = torch.zeros(mn, total // 2, dtype=torch.int8)
        sfs = []
        for start, hk in zip(starts, host_ks):
            if hk == 0:
                continue
            xg = x[start:start + hk]
            q, sf = per_token_cast_to_fp4(xg.T.contiguous(), use_ue8m0=True, gran_k=32)
            data[:, start // 2:(start + hk) // 2] = q
            sfs.append(sf.T.contiguous())
        return data, (torch.cat(sfs) if sfs else torch.empty(0, mn))
    layout = torch.tensor(ends if psum else host_ks, dtype=torch.int32)
    return a, b, cast(a, m), cast(b, n), starts, host_ks, layout


@pytest.mark.parametrize('psum', [False, True])
@pytest.mark.parametrize('accumulate', [False, True])
def test_k_grouped_fp4(psum, accumulate):
    m, n, alignment = 24, 40, 256
    logical_ks = [300, 0, 256, 130] if psum else [256, 0, 512, 256]
    old = dg.get_mk_alignment_for_contiguous_layout()
    dg.set_mk_alignment_for_contiguous_layout(alignment)
    try:
        a, b, qa, qb, starts, host_ks, layout = k_grouped_fp4_inputs(logical_ks, m, n, alignment, psum)
        g = len(logical_ks)
        c = torch.randn(g, m, n) * 32 if accumulate else None
        d = c.clone() if accumulate else torch.full((g, m, n), float('nan'))
        dg.k_grouped_fp4_gemm_nt_contiguous(qa, qb, d, host_ks, layout, d if accumulate else None,
                                            recipe=(1, 1, 32), use_psum_layout=psum)
        ref = torch.stack([a[s:s + k].float().T @ b[s:s + k].float() for s, k in zip(starts, logical_ks)])
        if accumulate:
            ref = ref + c
        assert calc_diff(d, ref) < 0.02  # FP4 quantization error, as DeepGEMM's FP4 thresholds
        # The FP8 `_tn` form on the same values (E2M1 is exact in E4M3) gives the same D, as
        # DeepGEMM's test checks; its scales are the FP4 ones (MN-major rows).
        from deep_gemm_cpu.utils import cast_back_from_fp4
        fa = cast_back_from_fp4(qa[0], torch.ones(m, 1), gran_k=qa[0].shape[1] * 2).T.contiguous()
        fb = cast_back_from_fp4(qb[0], torch.ones(n, 1), gran_k=qb[0].shape[1] * 2).T.contiguous()
        d8 = c.clone() if accumulate else torch.full((g, m, n), float('nan'))
        dg.k_grouped_fp8_gemm_tn_contiguous((fa.to(torch.float8_e4m3fn), qa[1]), (fb.to(torch.float8_e4m3fn), qb[1]),
                                            d8, host_ks, layout, d8 if accumulate else None,
                                            recipe=(1, 1, 32), use_psum_layout=psum)
        assert calc_diff(d, d8) < 1e-10
        # Scales packed by get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor give the same D.
        pa = dg.get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(qa[1], layout, host_ks, 32, alignment,
                                                                       use_psum_layout=psum)
        pb = dg.get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(qb[1], layout, host_ks, 32, alignment,
                                                                       use_psum_layout=psum)
        dp = c.clone() if accumulate else torch.full((g, m, n), float('nan'))
        dg.k_grouped_fp4_gemm_nt_contiguous((qa[0], pa), (qb[0], pb), dp, host_ks, layout, dp if accumulate else None,
                                            recipe=(1, 1, 32), use_psum_layout=psum)
        assert torch.equal(dp, d)
        if not psum:  # the psum form also runs without ks
            return
        d2 = c.clone() if accumulate else torch.full((g, m, n), float('nan'))
        dg.k_grouped_fp4_gemm_nt_contiguous(qa, qb, d2, None, layout, d2 if accumulate else None,
                                            recipe=(1, 1, 32), use_psum_layout=True)
        assert torch.equal(d2, d)
    finally:
        dg.set_mk_alignment_for_contiguous_layout(old)


def test_k_grouped_fp4_bad_input():
    a, b, qa, qb, _, host_ks, layout = k_grouped_fp4_inputs([256, 256], 8, 8, 256, False)
    d = torch.zeros(2, 8, 8)
    old = dg.get_mk_alignment_for_contiguous_layout()
    dg.set_mk_alignment_for_contiguous_layout(256)
    try:
        with pytest.raises(ValueError, match='recipe'):
            dg.k_grouped_fp4_gemm_nt_contiguous(qa, qb, d, host_ks, layout, recipe=(1, 1, 128))
        with pytest.raises(TypeError):
            dg.k_grouped_fp4_gemm_nt_contiguous((qa[0].view(torch.uint8), qa[1]), qb, d, host_ks, layout)
        dg.set_mk_alignment_for_contiguous_layout(128)
        with pytest.raises(ValueError, match='256'):
            dg.k_grouped_fp4_gemm_nt_contiguous(qa, qb, d, host_ks, layout)
    finally:
        dg.set_mk_alignment_for_contiguous_layout(old)
    assert torch.count_nonzero(d) == 0


# ---- deep_gemm.legacy --------------------------------------------------------------------------

def m_grouped_ref(a, b, idx):
    out = torch.zeros(a.shape[0], b.shape[1])
    for r in range(a.shape[0]):
        if idx[r] >= 0:
            out[r] = a[r].float() @ b[idx[r]].float().t()
    return out


@pytest.mark.parametrize('layout', ['nt', 'nn'])
def test_legacy_m_grouped(layout):
    g, n, k = 3, 24, 72
    idx = torch.tensor([0] * 5 + [-1] * 3 + [2] * 7 + [1] * 2 + [-1], dtype=torch.int32)
    a = torch.randn(idx.numel(), k, dtype=torch.bfloat16)
    b = torch.randn(g, n, k, dtype=torch.bfloat16)
    tb = b if layout == 'nt' else b.transpose(1, 2).contiguous()
    d = torch.full((idx.numel(), n), 9.0, dtype=torch.bfloat16)
    getattr(dg.legacy, f'm_grouped_bf16_gemm_{layout}_contiguous_tl')(a, tb, d, idx)
    assert calc_diff(d, m_grouped_ref(a, b, idx)) < 1e-5
    assert torch.all(d[idx < 0] == 0)  # padding rows zeroed, as the Triton kernel writes them
    # a-fused: rows gathered through m_row_indices (-1 reads zeros)
    rows = torch.randint(0, 11, (idx.numel(),), dtype=torch.int32)
    rows[3] = -1
    a_src = torch.randn(11, k, dtype=torch.bfloat16)
    gathered = torch.where((rows >= 0).unsqueeze(1), a_src[rows.long().clamp(min=0)], torch.zeros(1, k).bfloat16())
    d.fill_(9.0)
    getattr(dg.legacy, f'a_fused_m_grouped_bf16_gemm_{layout}_contiguous_tl')(a_src, tb, d, (idx, rows))
    assert calc_diff(d, m_grouped_ref(gathered, b, idx)) < 1e-5
    assert torch.all(d[idx < 0] == 0) and torch.all(d[3] == 0)


@pytest.mark.parametrize('fused', ['a', 'b'])
@pytest.mark.parametrize('acc', [True, False])
def test_legacy_k_grouped(fused, acc):
    m, n, ks = 20, 12, [64, 0, 128, 32]
    total = sum(ks)
    starts = torch.tensor([sum(ks[:i]) for i in range(len(ks))], dtype=torch.int32)
    ends = starts + torch.tensor(ks, dtype=torch.int32)
    src_rows = total + 9
    k_indices = torch.randint(0, src_rows, (total,), dtype=torch.int32)
    k_indices[5] = -1
    if fused == 'a':
        a, b = torch.randn(src_rows, m, dtype=torch.bfloat16), torch.randn(total, n, dtype=torch.bfloat16)
    else:
        a, b = torch.randn(total, m, dtype=torch.bfloat16), torch.randn(src_rows, n, dtype=torch.bfloat16)
    d0 = torch.randn(len(ks), m, n)
    d = d0.clone()
    getattr(dg.legacy, f'{fused}_fused_k_grouped_bf16_gemm_tn_contiguous_tl')(a, b, d, (k_indices, starts, ends), acc)
    src = (a if fused == 'a' else b).double()
    gathered = torch.where((k_indices >= 0).unsqueeze(1), src[k_indices.long().clamp(min=0)], torch.zeros(1).double())
    ga, gb = (gathered, b.double()) if fused == 'a' else (a.double(), gathered)
    for g in range(len(ks)):
        s, e = int(starts[g]), int(ends[g])
        ref = ga[s:e].t() @ gb[s:e] + (d0[g].double() if acc else 0)
        if ks[g] == 0:
            assert torch.equal(d[g], d0[g] if acc else torch.zeros(m, n))
        else:
            assert calc_diff(d[g], ref) < 1e-6


def test_legacy_bad_input():
    a, b = torch.randn(4, 16, dtype=torch.bfloat16), torch.randn(2, 8, 16, dtype=torch.bfloat16)
    d = torch.empty(4, 8, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="m_grouped_bf16_gemm_nt_contiguous_tl: argument 'm_indices'"):
        dg.legacy.m_grouped_bf16_gemm_nt_contiguous_tl(a, b, d, torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="m_grouped_bf16_gemm_nt_contiguous_tl: argument 'm_indices'"):
        dg.legacy.m_grouped_bf16_gemm_nt_contiguous_tl(a, b, d, torch.zeros(3, dtype=torch.int32))
    with pytest.raises(TypeError, match="argument 'a' must be bfloat16"):
        dg.legacy.m_grouped_bf16_gemm_nt_contiguous_tl(a.float(), b, d, torch.zeros(4, dtype=torch.int32))
    with pytest.raises(ValueError, match="m_row_indices"):
        dg.legacy.a_fused_m_grouped_bf16_gemm_nt_contiguous_tl(
            a, b, d, (torch.zeros(4, dtype=torch.int32), torch.full((4,), 4, dtype=torch.int32)))
    with pytest.raises(TypeError, match="'handle'"):
        dg.legacy.b_fused_k_grouped_bf16_gemm_tn_contiguous_tl(a, a, torch.empty(1, 16, 16), (None, None), True)
    with pytest.raises(ValueError, match="k_indices"):
        z = torch.zeros(1, dtype=torch.int32)
        dg.legacy.a_fused_k_grouped_bf16_gemm_tn_contiguous_tl(
            a, a, torch.empty(1, 16, 16), (torch.zeros(3, dtype=torch.int32), z, z + 3), True)


# ---- testing helpers ---------------------------------------------------------------------------

def test_testing_helpers(capsys, monkeypatch):
    assert dg.testing.get_arch_major() == 10

    calls = []

    @dg.testing.test_filter(lambda: True)
    def runs(x):
        calls.append(x)

    @dg.testing.test_filter(lambda: dg.testing.get_arch_major() >= 11)
    def filtered():
        calls.append('no')

    runs(1)
    filtered()
    assert calls == [1] and 'Filtered by' in capsys.readouterr().out

    monkeypatch.setenv('DG_S28_VAR', 'kept')

    @dg.testing.ignore_env('DG_S28_VAR', lambda: True)
    def without():
        assert 'DG_S28_VAR' not in os.environ
        raise RuntimeError('inside')

    @dg.testing.ignore_env('DG_S28_VAR', lambda: False)
    def with_it():
        return os.environ['DG_S28_VAR']

    with pytest.raises(RuntimeError):
        without()
    assert os.environ['DG_S28_VAR'] == 'kept' and with_it() == 'kept'

    x = torch.tensor([0.0, float('nan'), 1.5])
    dg.testing.assert_bitwise_equal(x, x.clone(), 'same')
    with pytest.raises(AssertionError, match='1 bytes differ|bytes differ'):
        dg.testing.assert_bitwise_equal(torch.tensor([0.0]), torch.tensor([-0.0]))
    with pytest.raises(AssertionError, match='shape'):
        dg.testing.assert_bitwise_equal(x, x[:2])
    with pytest.raises(AssertionError, match='dtype'):
        dg.testing.assert_bitwise_equal(x, x.double())
    dg.testing.assert_bitwise_equal(np.arange(4.0), np.arange(4.0))
    with pytest.raises(AssertionError):
        dg.testing.assert_bitwise_equal(np.zeros(2), -np.zeros(2))


# ---- alpha (DeepGEMM 2.8's dense GEMM epilogue) ----------------------------------------------

@pytest.mark.parametrize('layout', LAYOUTS)
@pytest.mark.parametrize('accumulate', [False, True])
def test_bf16_alpha(layout, accumulate):
    m, n, k = 37, 45, 200
    a, b = torch.randn(m, k, dtype=torch.bfloat16), torch.randn(n, k, dtype=torch.bfloat16)
    x, y = operands(layout, a, b)
    fn = getattr(dg, f'bf16_gemm_{layout}')
    alpha = -0.613
    c = torch.randn(m, n, dtype=torch.bfloat16) * 32 if accumulate else None
    d = c.clone() if accumulate else torch.empty(m, n, dtype=torch.bfloat16)
    fn(x, y, d, c=d if accumulate else None, alpha=alpha)
    # The contract: the float32 product, times alpha in float32, plus C, rounded once.
    acc = torch.empty(m, n, dtype=torch.float32)
    fn(x, y, acc)
    want = acc * torch.tensor(alpha, dtype=torch.float32)
    if accumulate:
        want = c.float() + want
    assert torch.equal(d, want.to(torch.bfloat16))
    ref = alpha * (a.double() @ b.double().t()) + (c.double() if accumulate else 0)
    assert calc_diff(d, ref) < 1e-5


@pytest.mark.parametrize('fp4_b', [False, True])
def test_fp8_fp4_alpha(fp4_b):
    # As DeepGEMM 2.8's test_gemm on SM100: alpha uniform in [-1, 1], ref = alpha * a @ b.T + c.
    m, n, k = 17, 64, 256
    a, b = torch.randn(m, k, dtype=torch.bfloat16), torch.randn(n, k, dtype=torch.bfloat16)
    from deep_gemm_cpu.utils import per_token_cast_to_fp8
    a_q = per_token_cast_to_fp8(a, use_ue8m0=True, gran_k=32)
    b_q = per_token_cast_to_fp4(b, use_ue8m0=True, gran_k=32) if fp4_b else \
        per_token_cast_to_fp8(b, use_ue8m0=True, gran_k=32)
    c = torch.randn(m, n, dtype=torch.float32) * 32
    for alpha in (0.25, -0.9):
        d = c.clone()
        dg.fp8_fp4_gemm_nt(a_q, b_q, d, c=d, recipe=(1, 1, 32), alpha=alpha)
        ref = alpha * (a.float() @ b.float().t()) + c
        assert calc_diff(d, ref) < (0.02 if fp4_b else 0.001)
        plain = torch.empty(m, n, dtype=torch.float32)
        dg.fp8_fp4_gemm_nt(a_q, b_q, plain, recipe=(1, 1, 32))
        assert torch.equal(d, c + plain * torch.tensor(alpha, dtype=torch.float32))
        # Pre-packed weights take alpha too, bitwise.
        pb = dg.pack_b(b_q, recipe=(1, 1, 32))
        dp = c.clone()
        dg.fp8_fp4_gemm_nt(a_q, pb, dp, c=dp, recipe=(1, 1, 32), alpha=alpha)
        assert torch.equal(dp, d)


def test_alpha_bad_input():
    a, b = torch.randn(4, 32, dtype=torch.bfloat16), torch.randn(8, 32, dtype=torch.bfloat16)
    d = torch.zeros(4, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match='alpha'):
        dg.bf16_gemm_nt(a, b, d, alpha=float('nan'))
    with pytest.raises(TypeError, match='alpha'):
        dg.bf16_gemm_nt(a, b, d, alpha='2')
    with pytest.raises(ValueError, match='alpha'):
        dg.bf16_gemm_nt(a, dg.pack_b(b), d, alpha=2.0)
    with pytest.raises(TypeError):  # as in DeepGEMM, the grouped GEMMs take no alpha
        dg.m_grouped_bf16_gemm_nt_masked(a.view(1, 4, 32), b.view(1, 8, 32), d.view(1, 4, 8),
                                         torch.tensor([4], dtype=torch.int32), 4, alpha=2.0)
    assert torch.count_nonzero(d) == 0


# ---- batched_syrk / batched_symm (DeepGEMM 2.8's batched cuBLASLt calls) -----------------------

@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float32])
@pytest.mark.parametrize('batched', [False, True])
def test_batched_syrk_symm(dtype, batched):
    g, m, k = 3, 21, 70
    shape = (g,) if batched else ()
    a = torch.randn(*shape, m, k).to(dtype)
    d = torch.empty(*shape, m, m, dtype=dtype)
    dg.batched_syrk(a, d)
    ref = a.double() @ a.double().mT
    assert calc_diff(d, ref) < (1e-5 if dtype == torch.bfloat16 else 1e-12)
    # bitwise the per-batch cuBLASLt GEMM (the contract), MN-major a included
    at = a.mT.contiguous().mT
    d_t = torch.empty_like(d)
    dg.batched_syrk(at, d_t)
    assert torch.equal(d_t, d)
    for i in range(g if batched else 1):
        w = torch.empty(m, m, dtype=dtype)
        ai = a[i] if batched else a
        dg.cublaslt_gemm_nt(ai, ai, w)
        assert torch.equal(w, d[i] if batched else d)
    s = torch.randn(*shape, m, m)
    s = (s + s.mT).to(dtype)
    b = torch.randn(*shape, m, k).to(dtype)
    d2 = torch.empty(*shape, m, k, dtype=dtype)
    dg.batched_symm(s, b, d2)
    assert calc_diff(d2, s.double() @ b.double()) < (1e-5 if dtype == torch.bfloat16 else 1e-12)


def test_batched_bad_input():
    a = torch.randn(2, 4, 8, dtype=torch.bfloat16)
    d = torch.zeros(2, 4, 4, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="'d'"):
        dg.batched_syrk(a, d.float())
    with pytest.raises(ValueError, match='batches'):
        dg.batched_syrk(a, torch.zeros(3, 4, 4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match='square'):
        dg.batched_symm(a, a, torch.zeros(2, 4, 8, dtype=torch.bfloat16))
    assert torch.count_nonzero(d) == 0


# ---- cublaslt_nvfp4_gemm_nt ----------------------------------------------------------------------

def to_cublaslt_vec16_sf_layout(sf):
    """As DeepGEMM 2.8's test helper: per-32 UE8M0 float scales -> per-16 UE4M3 bytes in
    cuBLASLt's VEC16 tiled layout [ceil(mn / 128), ceil(k / 64), 32, 4, 4]."""
    exp = (sf.view(torch.int32) >> 23) - 127
    ue4m3 = torch.where(exp >= -6, (exp + 7) << 3, 1 << (exp + 9)).to(torch.uint8).repeat_interleave(2, dim=1)
    mn, sf_k = ue4m3.shape
    tiles_mn, tiles_k = (mn + 127) // 128, (sf_k + 3) // 4
    padded = torch.zeros((tiles_mn * 128, tiles_k * 4), dtype=torch.uint8)
    padded[:mn, :sf_k] = ue4m3
    return padded.view(tiles_mn, 4, 32, tiles_k, 4).permute(0, 3, 2, 1, 4).contiguous()


@pytest.mark.parametrize('m,n,k', [(1, 7, 32), (37, 150, 96), (130, 64, 256)])
@pytest.mark.parametrize('accumulate', [False, True])
def test_cublaslt_nvfp4(m, n, k, accumulate):
    a, b = torch.randn(m, k), torch.randn(n, k)
    qa = per_token_cast_to_fp4(a, use_ue8m0=True, gran_k=32)
    qb = per_token_cast_to_fp4(b, use_ue8m0=True, gran_k=32)
    c = torch.randn(m, n) * 8 if accumulate else None
    d = c.clone() if accumulate else torch.empty(m, n)
    dg.cublaslt_nvfp4_gemm_nt((qa[0], to_cublaslt_vec16_sf_layout(qa[1])),
                              (qb[0], to_cublaslt_vec16_sf_layout(qb[1])), d, c=d if accumulate else None)
    from deep_gemm_cpu.utils import cast_back_from_fp4
    xa, xb = cast_back_from_fp4(qa[0], qa[1], gran_k=32), cast_back_from_fp4(qb[0], qb[1], gran_k=32)
    ref = xa.double() @ xb.double().t() + (c.double() if accumulate else 0)
    assert calc_diff(d, ref) < 1e-10
    w = c.clone() if accumulate else torch.empty(m, n)
    dg.bf16_gemm_nt(xa.bfloat16(), xb.bfloat16(), w, c=w if accumulate else None)
    assert torch.equal(d, w)  # the contract: the BF16 engine on the exact values


def test_cublaslt_nvfp4_bad_input():
    qa = per_token_cast_to_fp4(torch.randn(4, 48), use_ue8m0=True, gran_k=16)
    d = torch.zeros(4, 4)
    sf = torch.zeros(512, dtype=torch.uint8)
    with pytest.raises(ValueError, match='multiple of 32'):
        dg.cublaslt_nvfp4_gemm_nt((qa[0], sf), (qa[0], sf), d)
    q64 = per_token_cast_to_fp4(torch.randn(4, 64), use_ue8m0=True, gran_k=32)[0]
    with pytest.raises(ValueError, match='VEC16'):
        dg.cublaslt_nvfp4_gemm_nt((q64, sf[:100]), (q64, sf), d)
    assert torch.count_nonzero(d) == 0
