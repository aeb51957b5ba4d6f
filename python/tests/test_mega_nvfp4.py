"""The NVFP4 mega MoE (fp4_fp4_mega_moe, DeepGEMM 2.8) driven as DeepGEMM's NVFP4 test drives it:
an 'fp4xfp4' buffer, E2M1 tokens with per-16 E4M3 scales copied into buffer.x / buffer.x_sf, NVFP4
routed weights with MN-major int32 scales, per-expert alphas and a2 scales, BF16 shared experts on
x_bf16 and a routed scaling factor. y is checked against a float32 torch model of the chain
(upstream's thresholds: calc_diff < 1e-3, relative L2 < 2e-2), bitwise across rank counts and thread
counts, and the calls' errors."""
import os
import socket
import tempfile

import pytest
import torch
import torch.multiprocessing as mp

import deep_gemm_cpu as dg
from deep_gemm_cpu.utils.dist import init_dist

E, K, H, I, N, TMAX, S = 4, 3, 128, 64, 24, 32, 1
CLAMP, RSF = 10.0, 0.75
SPLITS = {1: [N], 2: [15, 9]}
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def _e2m1_rne(v):
    """E2M1 codes by round to nearest even, saturating at 6 (the GPU's cvt.rn.satfinite)."""
    a = v.abs()
    code = torch.zeros(v.shape, dtype=torch.uint8)
    for edge, tie_up in ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True),
                         (5.0, False)):
        code += (a >= edge if tie_up else a > edge).to(torch.uint8)
    return code | (((v < 0) & (code != 0)).to(torch.uint8) << 3)


def _nvfp4(x, g=1.0):
    """[m, n] -> (E2M1 pairs int8 [m, n/2], E4M3 scales as float [m, n/16]) with global scale g."""
    m, n = x.shape
    blocks = x.float().view(m, n // 16, 16)
    sf = ((blocks.abs().amax(dim=2) / 6.0) * (1.0 / g)).clamp_min(2.0 ** -9).to(torch.float8_e4m3fn).float()
    codes = _e2m1_rne(blocks / (sf * g).unsqueeze(2)).view(m, n // 2, 2)
    return (codes[..., 0] | (codes[..., 1] << 4)).view(torch.int8), sf


def _dequant(q, sf):
    u = q.view(torch.uint8).long()
    v = torch.stack([E2M1[u & 15], E2M1[u >> 4]], dim=-1).view(q.shape[0], -1)
    return v * sf.repeat_interleave(16, dim=1)


def _packed_sf(sf):
    """float E4M3 scale values [..., n/16] -> int32 words of four E4M3 bytes [..., n/64]."""
    b = sf.to(torch.float8_e4m3fn).view(torch.uint8).contiguous()
    return b.view(torch.int32)


def _problem():
    g = torch.Generator().manual_seed(11)
    x = torch.randn(N, H, generator=g).bfloat16()
    scores = torch.randn(N, E, generator=g)
    topk_weights, topk_idx = torch.topk(scores, K, dim=-1, sorted=False)
    topk_idx = topk_idx.masked_fill(torch.rand(N, K, generator=g) < 0.2, -1)
    topk_idx[5] = -1  # a token without experts
    topk_weights = topk_weights.softmax(dim=-1).masked_fill(topk_idx < 0, 0)
    l1 = torch.randn(E, 2 * I, H, generator=g).bfloat16() / 8
    l2 = torch.randn(E, H, I, generator=g).bfloat16() / 8
    sh1 = torch.randn(2 * S * I, H, generator=g).bfloat16() / 8
    sh2 = torch.randn(H, S * I, generator=g).bfloat16() / 8
    l1_alphas = 0.5 + torch.rand(E, 2, generator=g)
    l2_alphas = 0.5 + torch.rand(E, generator=g)
    a2 = 0.01 + torch.rand(E, generator=g) / 50
    return x, topk_idx, topk_weights, l1, l2, sh1, sh2, l1_alphas, l2_alphas, a2


def _weights(w):
    """BF16 [E, n, k] -> ((int8 [E, n, k/2], MN-major int32 [E, n, k/64]), float dequantized)."""
    qs, sfs, dq = [], [], []
    for i in range(w.shape[0]):
        q, sf = _nvfp4(w[i])
        qs.append(q), sfs.append(_packed_sf(sf)), dq.append(_dequant(q, sf))
    sf = torch.stack(sfs).transpose(1, 2).contiguous().transpose(1, 2)  # DeepGEMM's MN-major layout
    return (torch.stack(qs), sf), torch.stack(dq)


def _bf(t):
    return t.bfloat16().float()


def _reference(alphas=True, shared=True):
    """y in float32 torch ops, rounding where dg_fp4_fp4_mega_moe's chain rounds."""
    x, topk_idx, topk_weights, l1, l2, sh1, sh2, l1_alphas, l2_alphas, a2 = _problem()
    xq, xsf = _nvfp4(x)
    xd = _dequant(xq, xsf)
    w1d, w2d = _weights(l1)[1], _weights(l2)[1]
    partial = torch.zeros(N, K, H)
    for e in range(E):
        tok, slot = (topk_idx == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        al = l1_alphas[e] if alphas else torch.ones(2)
        g2, al2 = (float(a2[e]), float(l2_alphas[e])) if alphas else (1.0, 1.0)
        h = xd[tok] @ w1d[e].t()
        gate = _bf(h[:, :I] * al[0]).clamp(max=CLAMP)
        up = _bf(h[:, I:] * al[1]).clamp(-CLAMP, CLAMP)
        act = gate / (1 + torch.exp(-gate)) * up
        aq, asf = _nvfp4(act, g2)
        o = _bf(((_dequant(aq, asf) @ w2d[e].t()) * g2) * al2)
        partial[tok, slot] = _bf(o * topk_weights[tok, slot].unsqueeze(1))
    y = _bf(_bf(partial.sum(dim=1)) * RSF)
    if shared:
        h = x.float() @ sh1.float().t()
        gate, up = _bf(h[:, :S * I]).clamp(max=CLAMP), _bf(h[:, S * I:]).clamp(-CLAMP, CLAMP)
        act = _bf(gate / (1 + torch.exp(-gate)) * up)
        y = _bf(y + _bf(act @ sh2.float().t()))
    return y, torch.bincount(topk_idx[topk_idx >= 0].flatten(), minlength=E).int()


def _call(buf, rank, R, first, n, alphas=True, shared=True, pack=True):
    x, topk_idx, topk_weights, l1, l2, sh1, sh2, l1_alphas, l2_alphas, a2 = _problem()
    xq, xsf = _nvfp4(x)
    buf.x[:n].copy_(xq[first:first + n].view(torch.uint8))
    buf.x_sf[:n].copy_(_packed_sf(xsf)[first:first + n])
    buf.topk_idx[:n].copy_(topk_idx[first:first + n])
    buf.topk_weights[:n].copy_(topk_weights[first:first + n])
    epr = E // R
    lo, hi = rank * epr, (rank + 1) * epr
    (w1, s1), _ = _weights(l1)
    (w2, s2), _ = _weights(l2)
    t1, t2 = dg.transform_weights_for_mega_moe((w1[lo:hi], s1[lo:hi]), (w2[lo:hi], s2[lo:hi]), pack=pack)
    assert (t1.packed is not None) == pack and (t2.packed is not None) == pack
    kw = dict(l1_alphas=l1_alphas[lo:hi], l2_alphas=l2_alphas[lo:hi], a2_scales=a2[lo:hi]) if alphas else {}
    if shared:
        s1w, s2w = dg.transform_weights_for_mega_moe(sh1, sh2, pack=pack)
        kw.update(shared_l1_weights=s1w, shared_l2_weights=s2w, x_bf16=x[first:first + n])
    y = torch.empty(n, H, dtype=torch.bfloat16)
    stats = torch.full((epr,), 7, dtype=torch.int32)
    dg.fp4_fp4_mega_moe(y, t1, t2, buf, cumulative_local_expert_recv_stats=stats, activation_clamp=CLAMP,
                        routed_scaling_factor=RSF, **kw)
    return y, stats - 7


def _run_rank(local_rank, num_ranks, port, out_dir):
    os.environ['MASTER_ADDR'], os.environ['MASTER_PORT'] = '127.0.0.1', str(port)
    os.environ['DG_COMM_TIMEOUT'] = '30'
    torch.set_num_threads(1)
    rank, R, group = init_dist(local_rank, num_ranks)
    dg.set_num_sms(1 + rank % 2)  # thread counts differ between ranks: results must not
    buf = dg.get_symm_buffer_for_mega_moe(group, E, TMAX, K, H, I, num_shared_experts=S, mma_type='fp4xfp4')
    first = sum(SPLITS[R][:rank])
    y, stats = _call(buf, rank, R, first, SPLITS[R][rank])
    torch.save({'y': y, 'stats': stats}, os.path.join(out_dir, f'rank{rank}.pt'))
    buf.destroy()
    import torch.distributed as dist
    dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def test_nvfp4_one_rank_matches_reference():
    buf = dg.get_symm_buffer_for_mega_moe(None, E, TMAX, K, H, I, num_shared_experts=S, mma_type='fp4xfp4')
    assert buf.x.dtype == torch.uint8 and buf.x.shape[1] == H // 2
    assert buf.x_sf.dtype == torch.int32 and buf.x_sf.shape[1] == H // 64
    y, stats = _call(buf, 0, 1, 0, N)
    y_ref, recv = _reference()
    diff = float(dg.calc_diff(y.float(), y_ref))
    rel = float((y.float() - y_ref).norm() / y_ref.norm())
    assert diff < 1e-3 and rel < 2e-2, (diff, rel)
    assert torch.equal(stats, recv)
    # without alphas and shared experts (a buffer without them)
    buf0 = dg.get_symm_buffer_for_mega_moe(None, E, TMAX, K, H, I, mma_type='fp4xfp4')
    y0, _ = _call(buf0, 0, 1, 0, N, alphas=False, shared=False)
    y0_ref, _ = _reference(alphas=False, shared=False)
    assert float(dg.calc_diff(y0.float(), y0_ref)) < 1e-3
    assert torch.all(y0[5] == 0)
    # the same bits on the raw weights (no packed form), and on packed routed with raw shared ones
    y_raw, _ = _call(buf, 0, 1, 0, N, pack=False)
    assert torch.equal(y_raw, y)
    dg.set_print_paths(2)
    _call(buf, 0, 1, 0, N)
    assert any('dg_fp4_fp4_mega_moe_packed' in r for r in dg.get_path_report())
    dg.set_print_paths(0)
    # the same bits with another thread count
    sms = dg.get_num_sms()
    dg.set_num_sms(1 if sms > 1 else 2)
    y1, _ = _call(buf, 0, 1, 0, N)
    dg.set_num_sms(sms)
    assert torch.equal(y1, y)
    buf.destroy(), buf0.destroy()


def test_nvfp4_two_ranks_bitwise_one_rank():
    buf = dg.get_symm_buffer_for_mega_moe(None, E, TMAX, K, H, I, num_shared_experts=S, mma_type='fp4xfp4')
    y1, _ = _call(buf, 0, 1, 0, N)
    buf.destroy()
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_run_rank, args=(2, _free_port(), out), nprocs=2, join=True, start_method='spawn')
        parts = [torch.load(os.path.join(out, f'rank{r}.pt')) for r in range(2)]
    assert torch.equal(torch.cat([p['y'] for p in parts]), y1)
    _, recv = _reference()
    assert torch.equal(torch.cat([p['stats'] for p in parts]), recv)


def test_nvfp4_errors():
    x, topk_idx, topk_weights, l1, l2, sh1, sh2, l1_alphas, l2_alphas, a2 = _problem()
    (w1, s1), _ = _weights(l1)
    (w2, s2), _ = _weights(l2)
    y = torch.empty(N, H, dtype=torch.bfloat16)
    fp8_buf = dg.get_symm_buffer_for_mega_moe(None, E, TMAX, K, H, I)
    with pytest.raises(ValueError, match='requires an fp4xfp4 symmetric buffer'):
        dg.fp4_fp4_mega_moe(None, None, None, fp8_buf)
    fp8_buf.destroy()
    buf = dg.get_symm_buffer_for_mega_moe(None, E, TMAX, K, H, I, num_shared_experts=S, mma_type='fp4xfp4')
    bf16_buf = dg.get_symm_buffer_for_mega_moe(None, E, TMAX, K, H, I, mma_type='bf16xbf16')
    with pytest.raises(ValueError, match='requires an fp4xfp4'):
        dg.fp4_fp4_mega_moe(y, (w1, s1), (w2, s2), bf16_buf)
    bf16_buf.destroy()
    with pytest.raises(ValueError, match='mma_type'):
        dg.fp8_fp4_mega_moe(y, (w1, s1), (w2, s2), buf)
    with pytest.raises(ValueError, match='provided together'):
        dg.fp4_fp4_mega_moe(y, (w1, s1), (w2, s2), buf, shared_l1_weights=sh1, shared_l2_weights=sh2)
    with pytest.raises(ValueError, match='Shared-expert layout mismatch'):
        dg.fp4_fp4_mega_moe(y, (w1, s1), (w2, s2), buf)
    shared = dict(shared_l1_weights=sh1, shared_l2_weights=sh2, x_bf16=x)
    with pytest.raises(NotImplementedError, match='recipe'):
        dg.fp4_fp4_mega_moe(y, (w1, s1), (w2, s2), buf, recipe=(1, 1, 32), **shared)
    with pytest.raises(ValueError, match='a2_scales'):
        dg.fp4_fp4_mega_moe(y, (w1, s1), (w2, s2), buf, a2_scales=torch.zeros(E), **shared)
    with pytest.raises(ValueError, match='l1_alphas'):
        dg.fp4_fp4_mega_moe(y, (w1, s1), (w2, s2), buf, l1_alphas=torch.ones(E), **shared)
    with pytest.raises(ValueError, match='x_bf16'):
        dg.fp4_fp4_mega_moe(y, (w1, s1), (w2, s2), buf, **dict(shared, x_bf16=x[:3]))
    with pytest.raises(ValueError, match='l1_weights_sf'):
        dg.fp4_fp4_mega_moe(y, (w1, s1[:, :, :1]), (w2, s2), buf, **shared)
    with pytest.raises(ValueError, match='routed_scaling_factor'):
        dg.fp4_fp4_mega_moe(y, (w1, s1), (w2, s2), buf, routed_scaling_factor=float('inf'), **shared)
    with pytest.raises(ValueError, match='multiples of 64'):
        dg.get_symm_buffer_for_mega_moe(None, E, TMAX, K, H + 32, I, mma_type='fp4xfp4')
    with pytest.raises(ValueError, match='situ'):
        dg.get_symm_buffer_for_mega_moe(None, E, TMAX, K, H, I, mma_type='fp4xfp4', activation='situ')
    y0 = y.clone()
    with pytest.raises(ValueError):
        dg.fp4_fp4_mega_moe(y, (w1[:2], s1), (w2, s2), buf, **shared)
    assert torch.equal(y.view(torch.int16), y0.view(torch.int16))  # nothing written on error
    buf.destroy()
