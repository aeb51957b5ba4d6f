"""The SM90 FP8 mega MoE (fp8_mega_moe, DeepGEMM 2.8) driven as DeepGEMM's SM90 test drives it: a
get_symm_buffer_for_sm90_mega_moe buffer, tokens from per_token_cast_to_fp8(use_ue8m0=False,
gran_k=128) copied into buffer.x / buffer.x_sf, weights block-quantised per 128x128 and prepared
by transform_weights_for_mega_moe_sm90. y is checked against upstream's kind of float32 torch
reference (calc_diff < 0.01) and against a torch model of the exact chain (power-of-two activation
scales, calc_diff < 1e-6), bitwise across rank counts, thread counts and packed / raw weights;
masked slots, an expert without tokens, a token without experts; and the calls' errors."""
import os
import socket
import subprocess
import sys
import tempfile

import pytest
import torch
import torch.multiprocessing as mp

import deep_gemm_cpu as dg
from deep_gemm_cpu.utils.dist import init_dist

E, K, H, I, N, TMAX = 4, 3, 256, 128, 21, 32
CLAMP = 1.5
SPLITS = {1: [N], 2: [13, 8]}


def _block_quant(w):
    """[G, n, k] -> (E4M3 [G, n, k], float32 [G, n/128, k/128]): upstream's test quantisation."""
    g, n, k = w.shape
    v = w.view(g, n // 128, 128, k // 128, 128).float()
    sf = v.abs().amax(dim=(-1, -3)).clamp(1e-4) / 448.0
    return (v / sf.unsqueeze(-1).unsqueeze(-3)).to(torch.float8_e4m3fn).view(g, n, k).contiguous(), sf.contiguous()


def _block_dequant(w, sf):
    *lead, n, k = w.shape
    v = w.float().view(*lead, n // 128, 128, k // 128, 128)
    return (v * sf.unsqueeze(-1).unsqueeze(-3)).view(*lead, n, k)


def _problem():
    g = torch.Generator().manual_seed(23)
    x = torch.randn(N, H, generator=g).bfloat16()
    scores = torch.randn(N, E, generator=g)
    topk_weights, topk_idx = torch.topk(scores, K, dim=-1, sorted=False)
    topk_idx = topk_idx.masked_fill(torch.rand(N, K, generator=g) < 0.2, -1)
    topk_idx = topk_idx.masked_fill(topk_idx == 1, -1)  # expert 1 receives nothing
    topk_idx[5] = -1  # a token without experts
    topk_weights = topk_weights.masked_fill(topk_idx < 0, 0)
    l1 = (torch.randn(E, 2 * I, H, generator=g) * 0.05).bfloat16()
    l2 = (torch.randn(E, H, I, generator=g) * 0.05).bfloat16()
    xq, xsf = dg.per_token_cast_to_fp8(x, use_ue8m0=False, gran_k=128)
    return xq, xsf, topk_idx, topk_weights, _block_quant(l1), _block_quant(l2)


def _reference(exact_scales):
    """y in float32 torch ops. exact_scales: the chain of dg_fp8_mega_moe (power-of-two activation
    scales, as the kernel); else upstream's test reference (amax / 448 with a 1e-4 floor)."""
    xq, xsf, topk_idx, topk_weights, (w1, s1), (w2, s2) = _problem()
    x = (xq.float().view(N, H // 128, 128) * xsf.unsqueeze(-1)).view(N, H)
    w1d, w2d = _block_dequant(w1, s1), _block_dequant(w2, s2)
    partial = torch.zeros(N, K, H)
    for e in range(E):
        tok, slot = (topk_idx == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        h = x[tok] @ w1d[e].t()
        gate, up = h[:, :I].clamp(max=CLAMP), h[:, I:].clamp(-CLAMP, CLAMP)
        act = (gate / (1 + torch.exp(-gate)) * up) * topk_weights[tok, slot].unsqueeze(1)
        blocks = act.view(-1, I // 64, 64)
        amax = blocks.abs().amax(dim=-1, keepdim=True)
        sf = torch.exp2(torch.ceil(torch.log2(amax * (1 / 448)))) if exact_scales else amax.clamp(1e-4) / 448
        q = (blocks / sf).nan_to_num(0.0).to(torch.float8_e4m3fn).float()
        partial[tok, slot] = ((q * sf).view(-1, I) @ w2d[e].t()).bfloat16().float()
    y = partial.sum(dim=1).bfloat16()
    return y, torch.bincount(topk_idx[topk_idx >= 0].flatten(), minlength=E).int()


def _call(buf, rank, R, first, n, pack=True, transform=True):
    xq, xsf, topk_idx, topk_weights, (w1, s1), (w2, s2) = _problem()
    buf.x[:n].copy_(xq[first:first + n])
    buf.x_sf[:n].copy_(xsf[first:first + n])
    buf.topk_idx[:n].copy_(topk_idx[first:first + n])
    buf.topk_weights[:n].copy_(topk_weights[first:first + n])
    epr = E // R
    lo, hi = rank * epr, (rank + 1) * epr
    l1, l2 = (w1[lo:hi].contiguous(), s1[lo:hi].contiguous()), (w2[lo:hi].contiguous(), s2[lo:hi].contiguous())
    if transform:
        l1, l2 = dg.transform_weights_for_mega_moe_sm90(l1, l2, pack=pack)
        assert (l1.packed is not None) == pack and (l2.packed is not None) == pack
    y = torch.empty(n, H, dtype=torch.bfloat16)
    stats = torch.full((epr,), 3, dtype=torch.int32)
    dg.fp8_mega_moe(y, l1, l2, buf, cumulative_local_expert_recv_stats=stats, recipe=(128, 128, 128),
                    activation='swiglu', activation_clamp=CLAMP, fast_math=True)
    return y, stats - 3


def _run_rank(local_rank, num_ranks, port, out_dir):
    os.environ['MASTER_ADDR'], os.environ['MASTER_PORT'] = '127.0.0.1', str(port)
    os.environ['DG_COMM_TIMEOUT'] = '30'
    torch.set_num_threads(1)
    rank, R, group = init_dist(local_rank, num_ranks)
    dg.set_num_sms(1 + rank % 2)  # thread counts differ between ranks: results must not
    buf = dg.get_symm_buffer_for_sm90_mega_moe(group, E, TMAX, K, H, I)
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


def test_sm90_one_rank_matches_reference():
    buf = dg.get_symm_buffer_for_sm90_mega_moe(None, E, TMAX, K, H, I)
    assert isinstance(buf, dg.SM90SymmBuffer)
    assert buf.num_max_tokens_per_rank == 128 and buf.x.shape == (128, H) and buf.x.dtype == torch.float8_e4m3fn
    assert buf.x_sf.dtype == torch.float32 and buf.x_sf.shape == (128, H // 128)
    assert buf.topk_idx.dtype == torch.int64 and buf.topk_weights.shape == (128, K)
    assert buf.l1_acts is None and buf.l2_acts_sf is None
    y, stats = _call(buf, 0, 1, 0, N)
    upstream_ref, recv = _reference(exact_scales=False)
    assert float(dg.calc_diff(y.float(), upstream_ref.float())) < 0.01
    exact_ref, _ = _reference(exact_scales=True)
    assert float(dg.calc_diff(y.float(), exact_ref.float())) < 1e-6
    assert torch.equal(stats, recv) and recv[1] == 0
    assert torch.all(y[5] == 0)
    # the same bits on raw pairs, on copies without their packed form, and with another thread count
    for kw in (dict(transform=False), dict(pack=False)):
        y_other, _ = _call(buf, 0, 1, 0, N, **kw)
        assert torch.equal(y_other, y), kw
    dg.set_print_paths(2)
    _call(buf, 0, 1, 0, N)
    assert any('dg_fp8_mega_moe_packed' in r for r in dg.get_path_report())
    dg.set_print_paths(0)
    sms = dg.get_num_sms()
    dg.set_num_sms(1 if sms > 1 else 2)
    y1, _ = _call(buf, 0, 1, 0, N)
    dg.set_num_sms(sms)
    assert torch.equal(y1, y)
    buf.destroy()


def test_sm90_two_ranks_bitwise_one_rank():
    buf = dg.get_symm_buffer_for_sm90_mega_moe(None, E, TMAX, K, H, I)
    y1, _ = _call(buf, 0, 1, 0, N)
    buf.destroy()
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_run_rank, args=(2, _free_port(), out), nprocs=2, join=True, start_method='spawn')
        parts = [torch.load(os.path.join(out, f'rank{r}.pt')) for r in range(2)]
    assert torch.equal(torch.cat([p['y'] for p in parts]), y1)
    _, recv = _reference(exact_scales=True)
    assert torch.equal(torch.cat([p['stats'] for p in parts]), recv)


def _mpi_main(out_dir):
    """One rank under mpirun (an mpi4py communicator: the library's MPI bootstrap)."""
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, R = comm.Get_rank(), comm.Get_size()
    torch.set_num_threads(1)
    dg.set_print_paths(2)
    buf = dg.get_symm_buffer_for_sm90_mega_moe(comm, E, TMAX, K, H, I)
    y, stats = _call(buf, rank, R, sum(SPLITS[R][:rank]), SPLITS[R][rank])
    torch.save({'y': y, 'stats': stats, 'paths': dg.get_path_report()}, os.path.join(out_dir, f'rank{rank}.pt'))
    buf.destroy()


def test_sm90_mpirun_network_path():
    """2 ranks under mpirun with the MPI network path forced: bitwise the one-rank y."""
    from test_mega_launchers import _env, _mpirun
    mpirun = _mpirun()
    buf = dg.get_symm_buffer_for_sm90_mega_moe(None, E, TMAX, K, H, I)
    y1, stats1 = _call(buf, 0, 1, 0, N)
    buf.destroy()
    with tempfile.TemporaryDirectory() as d:
        out = subprocess.run([mpirun, '--allow-run-as-root', '--oversubscribe', '-n', '2', sys.executable,
                              os.path.abspath(__file__), 'mpi', d], env=_env(DG_COMM_FORCE_NETWORK='1'),
                             capture_output=True, text=True, timeout=240)
        assert out.returncode == 0, out.stdout + out.stderr
        res = [torch.load(os.path.join(d, f'rank{r}.pt')) for r in range(2)]
    assert torch.equal(torch.cat([r['y'] for r in res]), y1)
    assert torch.equal(torch.cat([r['stats'] for r in res]), stats1)
    for r in res:
        assert any('network path' in line and 'dg_fp8_mega_moe' in line for line in r['paths']), r['paths']


def test_sm90_errors():
    xq, xsf, topk_idx, topk_weights, l1, l2 = _problem()
    y = torch.empty(N, H, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match='FP8 tokens only'):
        dg.get_symm_buffer_for_sm90_mega_moe(None, E, TMAX, K, H, I, use_fp8_dispatch=False)
    with pytest.raises(ValueError, match='swiglu'):
        dg.get_symm_buffer_for_sm90_mega_moe(None, E, TMAX, K, H, I, activation='situ')
    with pytest.raises(ValueError, match='multiple of 256'):
        dg.get_symm_buffer_for_sm90_mega_moe(None, E, TMAX, K, H + 128, I)
    with pytest.raises(ValueError, match='multiple'):
        dg.get_symm_buffer_for_sm90_mega_moe(None, E, TMAX, K, H, I + 64)
    with pytest.raises(ValueError, match='get_symm_buffer_for_sm90_mega_moe'):
        dg.get_symm_buffer_for_mega_moe(None, E, TMAX, K, H, I, mma_type='sm90_fp8')
    fp8_buf = dg.get_symm_buffer_for_mega_moe(None, E, TMAX, K, H, I, mma_type='fp8xfp8')
    with pytest.raises(TypeError, match='SM90SymmBuffer'):
        dg.fp8_mega_moe(y, l1, l2, fp8_buf)
    fp8_buf.destroy()
    buf = dg.get_symm_buffer_for_sm90_mega_moe(None, E, TMAX, K, H, I)
    with pytest.raises(ValueError, match='mma_type'):
        dg.fp8_fp4_mega_moe(y, l1, l2, buf)
    with pytest.raises(ValueError, match='recipe'):
        dg.fp8_mega_moe(y, l1, l2, buf, recipe=(1, 128, 128))
    with pytest.raises(ValueError, match='swiglu'):
        dg.fp8_mega_moe(y, l1, l2, buf, activation='situ')
    with pytest.raises(TypeError, match='pair'):
        dg.fp8_mega_moe(y, l1[0], l2, buf)
    y0 = y.clone()
    with pytest.raises(ValueError, match='l1_weights_sf'):
        dg.fp8_mega_moe(y, (l1[0], l1[1][:, :1]), l2, buf)
    with pytest.raises(ValueError, match='l2_weights'):
        dg.fp8_mega_moe(y, l1, (l2[0][:, :128], l2[1]), buf)
    with pytest.raises(ValueError, match='activation_clamp'):
        dg.fp8_mega_moe(y, l1, l2, buf, activation_clamp=-1.0)
    assert torch.equal(y.view(torch.int16), y0.view(torch.int16))  # nothing written on error
    # transform_weights_for_mega_moe_sm90's checks
    tw = dg.transform_weights_for_mega_moe_sm90
    with pytest.raises(TypeError, match='pair'):
        tw(l1[0], l2)
    with pytest.raises(TypeError, match='float8_e4m3fn'):
        tw((l1[0].float(), l1[1]), l2)
    with pytest.raises(ValueError, match='3-D'):
        tw((l1[0][0], l1[1][0]), l2)
    with pytest.raises(ValueError, match='contiguous'):
        tw((l1[0].transpose(1, 2), l1[1]), l2)
    with pytest.raises(ValueError, match='one per 128x128 block'):
        tw((l1[0], l1[1][:, :1].contiguous()), l2)
    with pytest.raises(ValueError, match=r'\[E, 2 I, H\]'):
        tw(l2, l1)
    small = (l1[0][:, :, :128].contiguous(), l1[1][:, :, :1].contiguous())
    with pytest.raises(ValueError, match='multiple of 256'):
        tw(small, (l2[0][:, :128].contiguous(), l2[1][:, :1].contiguous()))
    buf.destroy()
    with pytest.raises(RuntimeError, match='destroyed'):
        dg.fp8_mega_moe(y, l1, l2, buf)


if __name__ == '__main__' and len(sys.argv) == 3 and sys.argv[1] == 'mpi':
    _mpi_main(sys.argv[2])
