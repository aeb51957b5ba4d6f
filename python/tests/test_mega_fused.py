"""The fused Mega MoE across processes, written the way DeepGEMM's tests/test_mega_moe.py drives it:
torch.multiprocessing.spawn, deep_gemm.utils.dist.init_dist (gloo here), get_symm_buffer_for_mega_moe,
inputs copied into the buffer views, transform_weights_for_mega_moe, fp8_fp4_mega_moe / bf16_mega_moe.
One global problem (uneven token counts, masked slots, an expert without tokens) is split over 1, 2
and 4 ranks: y must be bitwise the same for every rank count and within calc_diff of the
single-process reference; the recv stats must match. Failures raise on every rank: topk_idx out of
range, too many tokens on one rank, a wrong mma_type, a rank that exits without calling."""
import os
import socket
import tempfile

import pytest
import torch
import torch.multiprocessing as mp

import deep_gemm_cpu as dg
from deep_gemm_cpu.utils import per_token_cast_to_fp4, per_token_cast_to_fp8
from deep_gemm_cpu.utils.dist import init_dist

E, K, H, I, N, TMAX = 8, 3, 256, 128, 40, 48
SPLITS = {1: [N], 2: [23, 17], 4: [9, 0, 20, 11]}  # uneven; rank 1 of 4 has no token


def _problem(mma):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(N, H, generator=g).bfloat16()
    scores = torch.randn(N, E, generator=g)
    scores[:, 5] = -1e9  # expert 5 never receives a token
    topk_weights, topk_idx = torch.topk(scores, K, dim=-1, sorted=False)
    mask = torch.rand(N, K, generator=g) < 0.25
    topk_idx = topk_idx.masked_fill(mask, -1)
    topk_idx[7] = -1  # a token without experts
    topk_weights = topk_weights.sigmoid().masked_fill(topk_idx < 0, 0)
    l1 = torch.randn(E, 2 * I, H, generator=g).bfloat16() / 16
    l2 = torch.randn(E, H, I, generator=g).bfloat16() / 16
    if mma == 'bf16xbf16':
        return x, topk_idx, topk_weights, l1, l2

    def cast_weights(w):
        n, k = w.shape[1], w.shape[2]
        q = torch.empty(E, n, k // 2, dtype=torch.int8)
        sf = torch.empty(E, n, k // 32)
        for i in range(E):
            q[i], sf[i] = per_token_cast_to_fp4(w[i], use_ue8m0=True, gran_k=32)
        return q, dg.transform_sf_into_required_layout(sf, n, k, (1, 32), E)
    return (per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True), topk_idx, topk_weights,
            cast_weights(l1), cast_weights(l2))


def _experts(w, lo, hi):
    return tuple(t[lo:hi] for t in w) if isinstance(w, tuple) else w[lo:hi]


def _run_rank(local_rank, num_ranks, port, out_dir, mma, scenario):
    os.environ['MASTER_ADDR'], os.environ['MASTER_PORT'] = '127.0.0.1', str(port)
    os.environ['DG_COMM_TIMEOUT'] = '30'
    torch.set_num_threads(1)
    rank, R, group = init_dist(local_rank, num_ranks)
    dg.set_num_sms(1 + rank % 2)  # thread counts differ between ranks: results must not
    x, topk_idx, topk_weights, l1, l2 = _problem(mma)
    first, n = sum(SPLITS[R][:rank]), SPLITS[R][rank]
    epr = E // R
    buffer = dg.get_symm_buffer_for_mega_moe(group, E, TMAX, K, H, I, mma_type=mma)
    l1_t, l2_t = dg.transform_weights_for_mega_moe(_experts(l1, rank * epr, (rank + 1) * epr),
                                                   _experts(l2, rank * epr, (rank + 1) * epr))
    fn = dg.fp8_fp4_mega_moe if mma == 'fp8xfp4' else dg.bf16_mega_moe

    def put(idx=topk_idx):
        if mma == 'fp8xfp4':
            buffer.x[:n].copy_(x[0][first:first + n])
            buffer.x_sf[:n].copy_(x[1][first:first + n])
        else:
            buffer.x[:n].copy_(x[first:first + n])
        buffer.topk_idx[:n].copy_(idx[first:first + n])
        buffer.topk_weights[:n].copy_(topk_weights[first:first + n])

    result = {}
    if scenario == 'dead' and rank == 1:
        os._exit(0)  # never calls: the others must fail, not hang
    put()
    y = torch.full((n, H), float('nan'), dtype=torch.bfloat16)
    stats = torch.full((epr,), 7, dtype=torch.int32)
    try:
        fn(y, l1_t, l2_t, buffer, cumulative_local_expert_recv_stats=stats, activation_clamp=10.0)
        result['y'], result['stats'] = y.clone(), stats - 7
    except Exception as e:  # noqa: BLE001 - reported to the parent
        result['error'] = f'{type(e).__name__}: {e}'
    if scenario == 'failures':
        bad = topk_idx.clone()
        bad[first + n - 1 if n else first, 0] = E if n else bad[first, 0]
        put(bad if rank == R - 1 and n else topk_idx)
        for case, call in [
            ('topk', lambda: fn(y, l1_t, l2_t, buffer)),
            ('tokens', lambda: fn(torch.empty(TMAX + 1 if rank == 0 else n, H, dtype=torch.bfloat16), l1_t, l2_t,
                                  buffer)),
        ]:
            if case == 'tokens':
                put()
            y.fill_(float('nan'))
            try:
                call()
                result[case] = 'no error'
            except Exception as e:  # noqa: BLE001
                result[case] = f'{type(e).__name__}: {e}'
            result[case + '_untouched'] = bool(torch.isnan(y.float()).all())
        # still usable: a valid call succeeds on every rank
        put()
        y2 = torch.empty(n, H, dtype=torch.bfloat16)
        fn(y2, l1_t, l2_t, buffer, activation_clamp=10.0)
        result['again_equal'] = 'y' in result and torch.equal(y2, result['y'])
    buffer.destroy()
    try:
        fn(y, l1_t, l2_t, buffer)
        result['after_destroy'] = 'no error'
    except RuntimeError as e:
        result['after_destroy'] = str(e)
    torch.save(result, os.path.join(out_dir, f'rank{rank}.pt'))
    if scenario != 'dead':
        torch.distributed.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _spawn(R, mma, scenario='ok'):
    with tempfile.TemporaryDirectory() as d:
        ctx = mp.start_processes(_run_rank, args=(R, _free_port(), d, mma, scenario), nprocs=R, join=False,
                                 start_method='spawn')
        for p in ctx.processes:
            p.join(180)
        for p in ctx.processes:
            assert not p.is_alive(), 'a rank hung'
            p.kill()
        return [torch.load(os.path.join(d, f'rank{r}.pt')) if os.path.exists(os.path.join(d, f'rank{r}.pt'))
                else None for r in range(R)]


def _reference(mma):
    x, topk_idx, topk_weights, l1, l2 = _problem(mma)
    y = torch.empty(N, H, dtype=torch.bfloat16)
    stats = torch.zeros(E, dtype=torch.int32)
    fn = dg.fp8_fp4_mega_moe_reference if mma == 'fp8xfp4' else dg.bf16_mega_moe_reference
    fn(E, [x], [topk_idx], [topk_weights], [l1], [l2], [y], cumulative_local_expert_recv_stats=[stats],
       activation_clamp=10.0)
    return y, stats


@pytest.mark.parametrize('mma', ['fp8xfp4', 'bf16xbf16'])
def test_fused_matches_reference_and_rank_counts(mma):
    y_ref, stats_ref = _reference(mma)
    first = None
    for R in (1, 2, 4):
        res = _spawn(R, mma)
        for r, out in enumerate(res):
            assert out is not None and 'error' not in out, f'R={R} rank {r}: {out}'
            assert out['after_destroy'].endswith('destroyed'), out['after_destroy']
        y = torch.cat([out['y'] for out in res])
        stats = torch.cat([out['stats'] for out in res])
        assert torch.equal(stats, stats_ref), f'R={R}: recv stats {stats} != {stats_ref}'
        assert bool((y[7] == 0).all()), 'a token without experts must give zeros'
        if first is None:
            first = y
            diff = float(dg.calc_diff(y.float(), y_ref.float()))
            assert diff < (1e-3 if mma == 'fp8xfp4' else 1e-5), diff
        else:
            assert torch.equal(y, first), f'R={R}: y differs from R=1'


def test_failures_raise_on_every_rank():
    res = _spawn(2, 'fp8xfp4', 'failures')
    for r, out in enumerate(res):
        assert out is not None and 'error' not in out, out
        assert 'topk_idx' in out['topk'] and 'ValueError' in out['topk'], out['topk']
        assert 'num_max_tokens_per_rank' in out['tokens'] or 'rank 0' in out['tokens'], out['tokens']
        assert out['topk_untouched'] and out['tokens_untouched']
        assert out['again_equal']


def test_dead_rank_fails_the_others():
    res = _spawn(2, 'fp8xfp4', 'dead')
    assert res[1] is None
    assert 'RuntimeError' in res[0]['error'] and 'rank 1' in res[0]['error'], res[0]['error']


def test_single_process_without_group():
    """group=None without torch.distributed: one rank."""
    x, topk_idx, topk_weights, l1, l2 = _problem('bf16xbf16')
    buf = dg.get_symm_buffer_for_mega_moe(None, E, N, K, H, I, mma_type='bf16xbf16')
    buf.x[:N].copy_(x)
    buf.topk_idx[:N].copy_(topk_idx)
    buf.topk_weights[:N].copy_(topk_weights)
    y = torch.empty(N, H, dtype=torch.bfloat16)
    dg.bf16_mega_moe(y, l1, l2, buf, activation_clamp=10.0)
    y_ref, _ = _reference('bf16xbf16')
    assert float(dg.calc_diff(y.float(), y_ref.float())) < 1e-5
    with pytest.raises(ValueError, match='mma_type'):
        dg.fp8_fp4_mega_moe(y, (l1, l1), (l2, l2), buf)
    with pytest.raises(ValueError, match='num_shared_experts'):
        dg.bf16_mega_moe(y, l1, l2, buf, shared_l1_weights=l1, shared_l2_weights=l2)
    with pytest.raises(ValueError, match='num_max_tokens_per_rank'):
        dg.bf16_mega_moe(torch.empty(N + 9, H, dtype=torch.bfloat16), l1, l2, buf)
    with pytest.raises(ValueError):
        dg.bf16_mega_moe(y, l1[:3], l2, buf)
    view = buf.x
    buf.destroy()
    assert view.shape == (dg.utils.align(N, dg.get_token_alignment_for_mega_moe()), H)
    view.zero_()  # the memory outlives destroy() while a view exists
    with pytest.raises(RuntimeError, match='destroyed'):
        dg.bf16_mega_moe(y, l1, l2, buf)
    with pytest.raises(ValueError, match='num_shared_experts'):
        dg.get_symm_buffer_for_mega_moe(None, E, N, K, H, I, num_shared_experts=65)
    with pytest.raises(ValueError):
        dg.get_symm_buffer_for_mega_moe(None, E, N, E + 1, H, I)  # num_topk > num_experts
    assert dg.get_symm_buffer_size_for_mega_moe(1, E, N, K, H, I)[0] > N * H


def _shared_weights(mma, S=2):
    g = torch.Generator().manual_seed(5)
    w1 = torch.randn(2 * S * I, H, generator=g).bfloat16() / 16
    w2 = torch.randn(H, S * I, generator=g).bfloat16() / 16
    if mma == 'bf16xbf16':
        return w1, w2
    return (per_token_cast_to_fp8(w1, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True),
            per_token_cast_to_fp8(w2, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True))


def _one_rank(mma, shared):
    x, topk_idx, topk_weights, l1, l2 = _problem(mma)
    S = 2 if shared else 0
    buf = dg.get_symm_buffer_for_mega_moe(None, E, N, K, H, I, num_shared_experts=S, mma_type=mma)
    if mma == 'fp8xfp4':
        buf.x[:N].copy_(x[0])
        buf.x_sf[:N].copy_(x[1])
        assert (buf.shared_l1_acts_sf is not None) == shared
    else:
        buf.x[:N].copy_(x)
    buf.topk_idx[:N].copy_(topk_idx)
    buf.topk_weights[:N].copy_(topk_weights)
    y = torch.empty(N, H, dtype=torch.bfloat16)
    kw = {}
    if shared:
        kw['shared_l1_weights'], kw['shared_l2_weights'] = _shared_weights(mma)
    (dg.fp8_fp4_mega_moe if mma == 'fp8xfp4' else dg.bf16_mega_moe)(y, l1, l2, buf, activation_clamp=10.0, **kw)
    buf.destroy()
    return y


@pytest.mark.parametrize('mma', ['fp8xfp4', 'bf16xbf16'])
def test_shared_experts(mma):
    """y with shared experts = BF16(shared + routed), the shared expert as the library's dense
    GEMMs with SwiGLU (weight 1) between them, summed first."""
    routed, fused = _one_rank(mma, False), _one_rank(mma, True)
    x, *_ = _problem(mma)
    w1, w2 = _shared_weights(mma)
    h = torch.empty(N, w1[0].shape[0] if mma == 'fp8xfp4' else w1.shape[0], dtype=torch.bfloat16)
    o = torch.empty(N, H, dtype=torch.bfloat16)
    if mma == 'fp8xfp4':
        dg.fp8_gemm_nt(x, w1, h, recipe=(1, 1, 32))
    else:
        dg.bf16_gemm_nt(x, w1, h)
    hf = h.float()
    si = hf.shape[1] // 2
    gate, up = hf[:, :si].clamp(max=10.0), hf[:, si:].clamp(-10.0, 10.0)
    a = gate / (1 + torch.exp(-gate)) * up
    if mma == 'fp8xfp4':
        dg.fp8_gemm_nt(per_token_cast_to_fp8(a, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True), w2, o, recipe=(1, 1, 32))
    else:
        dg.bf16_gemm_nt(a.bfloat16(), w2, o)
    assert not torch.equal(fused, routed)
    want = (o.float() + routed.float()).bfloat16()
    assert float(dg.calc_diff(fused.float(), want.float())) < 1e-4


def _call_one_rank(mma, l1, l2, shared=None):
    """y of one rank (group None) on the problem's tokens, with the weights as given."""
    x, topk_idx, topk_weights, _, _ = _problem(mma)
    buf = dg.get_symm_buffer_for_mega_moe(None, E, N, K, H, I, num_shared_experts=2 if shared else 0, mma_type=mma)
    if mma == 'fp8xfp4':
        buf.x[:N].copy_(x[0])
        buf.x_sf[:N].copy_(x[1])
    else:
        buf.x[:N].copy_(x)
    buf.topk_idx[:N].copy_(topk_idx)
    buf.topk_weights[:N].copy_(topk_weights)
    y = torch.empty(N, H, dtype=torch.bfloat16)
    kw = {} if shared is None else dict(shared_l1_weights=shared[0], shared_l2_weights=shared[1])
    (dg.fp8_fp4_mega_moe if mma == 'fp8xfp4' else dg.bf16_mega_moe)(y, l1, l2, buf, activation_clamp=10.0, **kw)
    buf.destroy()
    return y


@pytest.mark.parametrize('mma', ['fp8xfp4', 'bf16xbf16'])
def test_transformed_weights_are_packed(mma):
    """transform_weights_for_mega_moe packs the weights once (routed grouped, shared dense); the
    calls on them give bitwise the calls on the raw weights, with or without shared experts,
    with the shared ones raw (then every weight is read raw), with pack=False, after free(), and
    under a lower ISA level than the one packed for (both run on the copies)."""
    *_, l1, l2 = _problem(mma)
    sh = _shared_weights(mma)
    lt1, lt2 = dg.transform_weights_for_mega_moe(l1, l2)
    st1, st2 = dg.transform_weights_for_mega_moe(*sh)
    packed = [getattr(w, 'packed', None) if mma == 'fp8xfp4' else w._dg_packed for w in (lt1, lt2, st1, st2)]
    assert all(isinstance(p, dg.PackedB) for p in packed)
    assert packed[0].shape == (E, 2 * I, H) and packed[1].shape == (E, H, I)
    assert packed[2].groups == 0 and packed[2].shape == (2 * 2 * I, H)
    if mma == 'fp8xfp4':  # DeepGEMM's pairs: unpack like tuples, same values in the CPU layout
        assert isinstance(lt1, dg.TransformedWeights) and isinstance(lt1, tuple) and len(lt1) == 2
        w, sf = lt1
        assert torch.equal(w, l1[0]) and torch.equal(sf, l1[1]) and w.data_ptr() != l1[0].data_ptr()
        assert packed[0].recipe_b == (1, 32)
    else:
        assert torch.equal(lt1, l1) and lt1.data_ptr() != l1.data_ptr()
    for shared, tshared in ((None, None), (sh, (st1, st2))):
        raw = _call_one_rank(mma, l1, l2, shared)
        dg.set_print_paths(True)
        dg.clear_path_report()
        assert torch.equal(_call_one_rank(mma, lt1, lt2, tshared), raw)
        assert any('pre-packed weights' in line for line in dg.get_path_report())
        dg.clear_path_report()
        dg.set_print_paths(False)
        if shared is not None:
            assert torch.equal(_call_one_rank(mma, lt1, lt2, shared), raw)  # shared raw: all raw
        unpacked = dg.transform_weights_for_mega_moe(l1, l2, pack=False)
        assert getattr(unpacked[0], 'packed', None) is None and getattr(unpacked[0], '_dg_packed', None) is None
        assert torch.equal(_call_one_rank(mma, *unpacked, tshared), raw)
    best = dg.get_isa()
    lower = {'amx': 'avx512_bf16', 'avx512_bf16': 'avx512', 'avx512': 'avx2', 'avx2': 'generic'}.get(best)
    if lower is not None:
        try:
            dg.set_isa(lower)
            raw_lower = _call_one_rank(mma, l1, l2, sh)
            assert torch.equal(_call_one_rank(mma, lt1, lt2, (st1, st2)), raw_lower)  # on the copies
        finally:
            dg.set_isa(best)
    packed[1].free()
    assert torch.equal(_call_one_rank(mma, lt1, lt2), _call_one_rank(mma, l1, l2))  # freed: on the copies
    with pytest.raises(TypeError, match='pair'):
        dg.transform_weights_for_mega_moe((l1[0] if mma == 'fp8xfp4' else l1,), l2)


def test_packed_call_errors():
    """The binding of the `_packed` calls: PackedB arguments only, the library's checks."""
    *_, l1, l2 = _problem('fp8xfp4')
    lt1, lt2 = dg.transform_weights_for_mega_moe(l1, l2)
    buf = dg.get_symm_buffer_for_mega_moe(None, E, N, K, H, I)
    y = torch.empty(1, H, dtype=torch.bfloat16)
    from deep_gemm_cpu import _C
    with pytest.raises(TypeError, match='PackedB'):
        _C.fused_mega_moe_packed(y, True, lt1.packed, l2, buf._handle)
    with pytest.raises(ValueError, match='l1_weights'):
        _C.fused_mega_moe_packed(y, True, lt2.packed, lt2.packed, buf._handle)
    with pytest.raises(TypeError, match='bfloat16'):
        bt1, bt2 = dg.transform_weights_for_mega_moe(torch.zeros(E, 2 * I, H, dtype=torch.bfloat16),
                                                     torch.zeros(E, H, I, dtype=torch.bfloat16))
        _C.fused_mega_moe_packed(y, True, bt1._dg_packed, bt2._dg_packed, buf._handle)
    lt1.packed.free()
    with pytest.raises(ValueError, match='freed'):
        _C.fused_mega_moe_packed(y, True, lt1.packed, lt2.packed, buf._handle)
    buf.destroy()


def test_situ_activation():
    """activation='situ' (DeepGEMM 2.8, FP8 x FP4 only): the same y raw and pre-packed, with shared
    experts; within calc_diff of the chain of public kernels with SiTU in torch; DeepGEMM's
    argument rules."""
    x, topk_idx, topk_weights, l1, l2 = _problem('fp8xfp4')
    sh = _shared_weights('fp8xfp4')
    beta, lbeta = 4.0, 25.0
    buf = dg.get_symm_buffer_for_mega_moe(None, E, N, K, H, I, num_shared_experts=2, activation='situ')
    buf.x[:N].copy_(x[0])
    buf.x_sf[:N].copy_(x[1])
    buf.topk_idx[:N].copy_(topk_idx)
    buf.topk_weights[:N].copy_(topk_weights)
    kw = dict(activation='situ', situ_beta=beta, situ_linear_beta=lbeta)
    y_raw = torch.empty(N, H, dtype=torch.bfloat16)
    dg.fp8_fp4_mega_moe(y_raw, l1, l2, buf, shared_l1_weights=sh[0], shared_l2_weights=sh[1], **kw)
    lt = dg.transform_weights_for_mega_moe(l1, l2, activation='situ')
    st = dg.transform_weights_for_mega_moe(*sh)
    y_packed = torch.empty(N, H, dtype=torch.bfloat16)
    dg.fp8_fp4_mega_moe(y_packed, *lt, buf, shared_l1_weights=st[0], shared_l2_weights=st[1], **kw)
    assert torch.equal(y_raw, y_packed)
    y_swiglu = torch.empty(N, H, dtype=torch.bfloat16)
    dg.fp8_fp4_mega_moe(y_swiglu, l1, l2, buf, shared_l1_weights=sh[0], shared_l2_weights=sh[1])
    assert not torch.equal(y_raw, y_swiglu)

    def expert(xq, w1, w2, weight):  # one expert (or the shared ones) on FP8 rows, SiTU in torch
        h = torch.empty(xq[0].shape[0], w1[0].shape[0], dtype=torch.bfloat16)
        dg.fp8_fp4_gemm_nt(xq, w1, h, recipe=(1, 1, 32))
        hf = h.float()
        si = hf.shape[1] // 2
        g, u = hf[:, :si], hf[:, si:]
        a = torch.sigmoid(g) * (beta * torch.tanh(g / beta)) * (lbeta * torch.tanh(u / lbeta)) * weight[:, None]
        o = torch.empty(xq[0].shape[0], w2[0].shape[0], dtype=torch.bfloat16)
        dg.fp8_fp4_gemm_nt(per_token_cast_to_fp8(a, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True), w2, o, recipe=(1, 1, 32))
        return o.float()
    want = expert(x, sh[0], sh[1], torch.ones(N))
    for e in range(E):
        for j in range(K):
            rows = (topk_idx[:, j] == e).nonzero().flatten()
            if len(rows):
                xs = (x[0][rows], x[1][rows])
                want[rows] += expert(xs, (l1[0][e], l1[1][e]), (l2[0][e], l2[1][e]), topk_weights[rows, j])
    assert float(dg.calc_diff(y_raw.float(), want)) < 1e-3
    for bad, match in [(dict(activation='situ', situ_beta=beta), 'situ_linear_beta'),
                       (dict(activation='situ', situ_beta=0.0, situ_linear_beta=lbeta), 'situ_beta'),
                       (dict(activation='situ', situ_beta=float('inf'), situ_linear_beta=lbeta), 'situ_beta'),
                       (dict(kw, activation_clamp=10.0), 'activation_clamp'),
                       (dict(situ_beta=beta, situ_linear_beta=lbeta), 'situ'),
                       (dict(activation='gelu'), 'activation')]:
        with pytest.raises(ValueError, match=match):
            dg.fp8_fp4_mega_moe(y_raw, l1, l2, buf, shared_l1_weights=sh[0], shared_l2_weights=sh[1], **bad)
    buf.destroy()
    with pytest.raises(ValueError, match='situ'):
        dg.get_symm_buffer_for_mega_moe(None, E, N, K, H, I, mma_type='bf16xbf16', activation='situ')
    with pytest.raises(ValueError, match='situ'):
        dg.transform_weights_for_mega_moe(torch.zeros(E, 2 * I, H, dtype=torch.bfloat16),
                                          torch.zeros(E, H, I, dtype=torch.bfloat16), activation='situ')


def test_fp8_routed_weights():
    """mma_type='fp8xfp8' (DeepGEMM 2.8: fp8_fp4_mega_moe on FP8 routed weights with per-1x32
    UE8M0 scales): raw and pre-packed give the same y, within calc_diff of the chain of public
    kernels; an FP4 weight on such a buffer, and a buffer of the other kind, are refused."""
    x, topk_idx, topk_weights, *_ = _problem('fp8xfp4')
    g = torch.Generator().manual_seed(9)

    def cast(w):  # [E, n, k] BF16 -> FP8 with per-1x32 UE8M0 scales, DeepGEMM's test layout
        n, k = w.shape[1], w.shape[2]
        q = torch.empty(E, n, k, dtype=torch.float8_e4m3fn)
        sf = torch.empty(E, n, k // 32)
        for i in range(E):
            q[i], sf[i] = per_token_cast_to_fp8(w[i], use_ue8m0=True, gran_k=32)
        return q, dg.transform_sf_into_required_layout(sf, n, k, (1, 32), E)
    l1 = cast(torch.randn(E, 2 * I, H, generator=g).bfloat16() / 16)
    l2 = cast(torch.randn(E, H, I, generator=g).bfloat16() / 16)
    buf = dg.get_symm_buffer_for_mega_moe(None, E, N, K, H, I, mma_type='fp8xfp8')
    assert buf.x_sf is not None
    buf.x[:N].copy_(x[0])
    buf.x_sf[:N].copy_(x[1])
    buf.topk_idx[:N].copy_(topk_idx)
    buf.topk_weights[:N].copy_(topk_weights)
    y_raw, y_packed = (torch.empty(N, H, dtype=torch.bfloat16) for _ in range(2))
    dg.fp8_fp4_mega_moe(y_raw, l1, l2, buf, activation_clamp=10.0)
    dg.fp8_fp4_mega_moe(y_packed, *dg.transform_weights_for_mega_moe(l1, l2), buf, activation_clamp=10.0)
    assert torch.equal(y_raw, y_packed)
    want = torch.zeros(N, H)
    for e in range(E):
        for j in range(K):
            rows = (topk_idx[:, j] == e).nonzero().flatten()
            if not len(rows):
                continue
            h = torch.empty(len(rows), 2 * I, dtype=torch.bfloat16)
            dg.fp8_gemm_nt((x[0][rows], x[1][rows]), (l1[0][e], l1[1][e]), h, recipe=(1, 1, 32))
            hf = h.float()
            gate, up = hf[:, :I].clamp(max=10.0), hf[:, I:].clamp(-10.0, 10.0)
            a = gate / (1 + torch.exp(-gate)) * up * topk_weights[rows, j][:, None]
            o = torch.empty(len(rows), H, dtype=torch.bfloat16)
            dg.fp8_gemm_nt(per_token_cast_to_fp8(a, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True), (l2[0][e], l2[1][e]), o,
                           recipe=(1, 1, 32))
            want[rows] += o.float()
    assert float(dg.calc_diff(y_raw.float(), want)) < 1e-3
    *_, f1, f2 = _problem('fp8xfp4')
    with pytest.raises(TypeError):
        dg.fp8_fp4_mega_moe(y_raw, f1, f2, buf)  # FP4 weights on an fp8xfp8 buffer
    with pytest.raises(ValueError, match='situ'):
        dg.fp8_fp4_mega_moe(y_raw, l1, l2, buf, activation='situ', situ_beta=4.0, situ_linear_beta=25.0)
    buf.destroy()
    b4 = dg.get_symm_buffer_for_mega_moe(None, E, N, K, H, I)
    with pytest.raises(TypeError):
        dg.fp8_fp4_mega_moe(y_raw, l1, l2, b4)  # FP8 weights on an fp8xfp4 buffer
    b4.destroy()
