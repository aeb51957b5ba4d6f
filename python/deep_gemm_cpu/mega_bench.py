"""The fused Mega MoE (``fp8_fp4_mega_moe`` / ``bf16_mega_moe``) across R rank processes of this
machine, against the unfused chain built from the public kernels, on the same inputs.

    PYTHONPATH=build/python python -m deep_gemm_cpu.mega_bench --ranks R [--tokens T ...]
        [--mma fp8xfp4|bf16xbf16] [--full] [--quick] [--json FILE]
        [--experts N] [--threads N] [--reps N] [--clamp C] [--limits auto|dgbench|python|FILE]

The command spawns its R ranks itself (torch.multiprocessing, ``deep_gemm_cpu.utils.dist.
init_dist`` over gloo on a free port); each rank runs ``threads`` threads (torch.set_num_threads
and ``set_num_sms``; default max(1, cores // R), so that the ranks do not oversubscribe the
cores) and owns E/R experts.

Under MPI the launcher starts the ranks instead, and the symmetric buffer is made over
``mpi4py.MPI.COMM_WORLD`` (the library's MPI bootstrap; the unfused chain and the timing
barriers still use a gloo group, which meets on 127.0.0.1: the ranks must share one machine):

    mpirun -n R python -m deep_gemm_cpu.mega_bench --mpi [--network] [options]

``--network`` sets ``DG_COMM_FORCE_NETWORK=1`` in every rank before the buffer is made, so the
fused call exchanges its tokens and outputs through MPI (``MPI_Allgatherv`` / ``MPI_Alltoallv``)
as ranks on different machines would, instead of the shared-memory segment; the ``path (rank
0)`` line quotes the call's path report. A rank that fails mid-run aborts the job.

Configurations:

- default: V4-Flash-like, hidden 4096, intermediate 2048, top-6, with 16 experts (of 256) so
  that a run stays around a minute; tokens per rank 1, 8, 64 (decoding) and 512 (prefill);
- ``--full``: DeepGEMM's reference configuration, 384 experts, top-6, hidden 7168,
  intermediate 3072, tokens per rank 1, 8, 64 and 2048; refused when the weights (and the
  rest) would not fit in MemAvailable;
- ``--quick``: tiny dimensions (a smoke test of a few seconds).

Per token count the ranks route their tokens (random scores, top-k, normalized sigmoid
weights), then time, after a warm-up and with a barrier before every call, the median of a few
calls of

- fused: the tokens copied into the symmetric buffer (not timed), then ``fp8_fp4_mega_moe`` /
  ``bf16_mega_moe`` (dispatch from the peers' shared-memory buffers, the expert waves, combine
  in the source rank's buffer);
- unfused: ``uneven_all_gather`` of every rank's x (and x_sf), topk_idx and topk_weights; the
  m-grouped contiguous layout of the rank's experts (rows sorted by local expert, the layout
  the local expert index of every row); on the same weights as the fused call (the PackedB's
  that transform_weights_for_mega_moe attached), ``m_grouped_fp8_fp4_gemm_nt_contiguous`` (recipe
  (1, 1, 32)) or ``m_grouped_bf16_gemm_nt_contiguous``; SwiGLU with the clamp and the top-k
  weight in torch, ``per_token_cast_to_fp8(use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)``; the second grouped
  GEMM; the output rows sent back to their source ranks (gloo isend / irecv: each receiver
  derives from the gathered top-k which rows every peer returns, in which order) and summed
  there per token in slot order.

Printed per token count and rank: received (token, slot) pairs, active local experts, fused
time, TFLOPS (2 * pairs * hidden * intermediate * 3), %lim (the larger of the compute bound
(the FP8 x FP4 engine computes on the BF16 path: layer_bench's compute_peak for BF16 kernels)
and the DRAM bound (the active experts' weights read once) over the time; a rank's share of the
machine is threads / the threads the limits were measured with for compute and 1/R of the DRAM
bandwidth), communication GB/s (dispatched x rows plus the BF16 rows returned per received
pair, hidden * 3 bytes for FP8 as DeepGEMM's test counts, pairs of the rank's own tokens
included, over the fused time), tokens/s (the
rank's tokens over the fused time), the unfused time, fused/unfused speedup (unfused time over
fused time: > 1, the fused call is faster) and calc_diff of the fused output against the
unfused one, "(bitwise)" when they are equal (the exit status is 2 when it exceeds 1e-3 or the
recv stats disagree with the unfused chain's routing). An "all" row per token count sums the
ranks over the slowest rank's time, against the whole machine's limits. The limits come from
``dgbench --json`` as in layer_bench (measured at start; --limits FILE reuses a measurement).
"""
import argparse
import json
import os
import socket
import statistics
import sys
import time

import torch

import deep_gemm_cpu as dg
from deep_gemm_cpu.layer_bench import compute_peak, cpu_name, measure_limits, rand_fp4_weights

BF16, F32 = torch.bfloat16, torch.float32
MAX_DIFF = 1e-3
CLAMP = 10.0

CONFIGS = {
    'default': dict(name='V4-Flash-like', hidden=4096, inter=2048, experts=16, real_experts=256, topk=6,
                    tokens=(1, 8, 64, 512)),
    'full': dict(name='DeepGEMM reference', hidden=7168, inter=3072, experts=384, real_experts=384, topk=6,
                 tokens=(1, 8, 64, 2048)),
    'quick': dict(name='quick', hidden=512, inter=256, experts=8, real_experts=8, topk=6, tokens=(1, 16)),
}


# ---- sizes and memory ---------------------------------------------------------------------

def expert_weight_bytes(cfg, mma):
    H, I = cfg['hidden'], cfg['inter']
    if mma == 'bf16xbf16':
        return 2 * (2 * I * H + H * I)
    # packed E2M1 (half a byte per value) and one UE8M0 byte per 32 values
    return (2 * I * H + H * I) // 2 + (2 * I * H + H * I) // 32


def mem_available():
    try:
        with open('/proc/meminfo') as f:
            for line in f:
                if line.startswith('MemAvailable:'):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def memory_plan(cfg, mma, ranks, tokens):
    """Peak bytes the run needs on this machine: (with transform_weights_for_mega_moe's copy of
    the weights, without it). Generating the weights and the unfused chain do not overlap."""
    E, H, I, K = cfg['experts'], cfg['hidden'], cfg['inter'], cfg['topk']
    weights = E * expert_weight_bytes(cfg, mma)
    tmax = max(tokens)
    buffer = ranks * dg.get_symm_buffer_size_for_mega_moe(ranks, E, tmax, K, H, I, mma_type=mma)[0]
    # unfused chain per rank: the gathered tokens of every rank, then per received pair (about
    # tmax * K per rank) the L1 output (BF16), SwiGLU in float32 with its temporaries, the
    # activations, the L2 output and the combine rows
    xbytes = H * (1 if mma == 'fp8xfp4' else 2)
    pairs = tmax * K
    chain = ranks * (ranks * tmax * (xbytes + H // 32 + 16 * K) + pairs * (2 * I * 2 + 8 * I * 4 + I + 3 * H * 2))
    # generating one rank's weights: int32 temporaries of the FP4 scales (two of 4 bytes per
    # scale byte), or one expert in float32 for BF16; the processes themselves (torch, gloo)
    epr = E // ranks
    gen = 8 * epr * (2 * I * H) // 32 if mma == 'fp8xfp4' else 4 * 2 * I * H
    procs = ranks * ((400 << 20) + (64 << 20))   # and the fused call's wave buffers
    base = weights + buffer + procs + max(chain, ranks * gen)
    # transform_weights_for_mega_moe copies the weights once they exist (the originals are then
    # freed) and packs them: about 3.2 bytes per weight (BF16 panels, FP4 codes, decode panels
    # or AMX nibble planes, scales)
    packed = 13 * E * 3 * H * I // 4
    return max(base, 2 * weights + buffer + procs) + packed, base


# ---- inputs --------------------------------------------------------------------------------

def make_weights(cfg, mma, rank, ranks, seed):
    """This rank's E/R experts: L1 [E/R, 2I, H] and L2 [E/R, H, I]."""
    g = torch.Generator().manual_seed(1000 * seed + 17 * rank + 1)
    epr, H, I = cfg['experts'] // ranks, cfg['hidden'], cfg['inter']
    if mma == 'fp8xfp4':
        return rand_fp4_weights(epr, 2 * I, H, g), rand_fp4_weights(epr, H, I, g)
    l1 = torch.empty(epr, 2 * I, H, dtype=BF16)
    l2 = torch.empty(epr, H, I, dtype=BF16)
    for e in range(epr):
        l1[e] = torch.randn(2 * I, H, generator=g, dtype=BF16) / H ** 0.5
        l2[e] = torch.randn(H, I, generator=g, dtype=BF16) / I ** 0.5
    return l1, l2


def make_tokens(cfg, mma, rank, T, seed):
    g = torch.Generator().manual_seed(1000 * seed + 31 * rank + 7 * T + 2)
    x = torch.randn(T, cfg['hidden'], generator=g).to(BF16)
    scores = torch.randn(T, cfg['experts'], generator=g).sigmoid()
    w, idx = scores.topk(cfg['topk'], dim=-1)
    w = (w / w.sum(-1, keepdim=True)).float().contiguous()
    if mma == 'fp8xfp4':
        xq = dg.utils.per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
    else:
        xq = (x,)
    return xq, idx.long().contiguous(), w


# ---- the unfused chain --------------------------------------------------------------------------

def _gemm_weights(w):
    """b for the m-grouped GEMMs: the PackedB transform_weights_for_mega_moe attached, else w."""
    p = getattr(w, 'packed', None) if isinstance(w, tuple) else getattr(w, '_dg_packed', None)
    return w if p is None else p


class Unfused:
    """Dispatch (all-gather), m-grouped contiguous GEMM, SwiGLU + FP8 cast in torch, m-grouped
    GEMM, the output rows sent back to their source ranks and summed there in slot order."""

    def __init__(self, cfg, mma, rank, ranks, group, l1, l2, clamp):
        from deep_gemm_cpu.utils.dist import uneven_all_gather
        self.gather = uneven_all_gather
        self.cfg, self.mma, self.rank, self.ranks, self.group = cfg, mma, rank, ranks, group
        # the same weights as the fused call: pre-packed when transform_weights_for_mega_moe packed them
        self.l1, self.l2, self.clamp = _gemm_weights(l1), _gemm_weights(l2), clamp
        self.epr = cfg['experts'] // ranks

    def _local_pairs(self, flat_e, owner):
        """Flat (row * K + slot) indices of the gathered pairs routed to `owner`'s experts, sorted by
        expert (stably: (source rank, token, slot) order within an expert)."""
        sel = torch.nonzero((flat_e >= 0) & (flat_e // self.epr == owner)).flatten()
        return sel[torch.argsort(flat_e[sel], stable=True)]

    def __call__(self, xq, topk_idx, topk_w):
        import torch.distributed as dist
        K, H, I = self.cfg['topk'], self.cfg['hidden'], self.cfg['inter']
        me, R, group = self.rank, self.ranks, self.group
        T = topk_idx.shape[0]
        # 1. dispatch: every rank's tokens
        xs = [self.gather(t, group=group) for t in xq]
        idx = self.gather(topk_idx, group=group)
        wts = self.gather(topk_w, group=group)
        counts = [torch.zeros(1, dtype=torch.long) for _ in range(R)]
        dist.all_gather(counts, torch.tensor([T], dtype=torch.long), group=group)
        counts = [int(c) for c in counts]
        offsets = [sum(counts[:r]) for r in range(R + 1)]
        flat_e = idx.flatten()
        # 2. the m-grouped contiguous layout of this rank's experts
        pairs = self._local_pairs(flat_e, me)
        rows = pairs // K
        layout = (flat_e[pairs] - me * self.epr).int().contiguous()
        M = rows.numel()
        d1 = torch.empty(M, 2 * I, dtype=BF16)
        if self.mma == 'fp8xfp4':
            a = (xs[0][rows].contiguous(), xs[1][rows].contiguous())
            dg.m_grouped_fp8_fp4_gemm_nt_contiguous(a, self.l1, d1, layout, recipe=(1, 1, 32))
        else:
            dg.m_grouped_bf16_gemm_nt_contiguous(xs[0][rows].contiguous(), self.l1, d1, layout)
        # 3./4. SwiGLU with the clamp and the top-k weight, the activation cast
        gate, up = d1[:, :I].float(), d1[:, I:].float()
        if self.clamp is not None:
            c = float(torch.tensor(self.clamp, dtype=BF16))
            gate, up = gate.clamp(max=c), up.clamp(-c, c)
        # the fused kernel's float32 formula (gate / (1 + exp(-gate))) * up * weight; exp in double,
        # rounded to float32, agrees with the library's exp (within 1.1 ulp) far more often than
        # torch's float32 exp
        act = gate / (1 + torch.exp(-gate.double()).float()) * up * wts.flatten()[pairs].unsqueeze(1)
        d2 = torch.empty(M, H, dtype=BF16)
        if self.mma == 'fp8xfp4':
            # packed UE8M0 scales, as the fused kernel hands its activations' to the L2 GEMM
            # (folded into A: one accumulation chain over K, deepgemm.h)
            aq = dg.utils.per_token_cast_to_fp8(act, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
            dg.m_grouped_fp8_fp4_gemm_nt_contiguous(aq, self.l2, d2, layout, recipe=(1, 1, 32))
        else:
            dg.m_grouped_bf16_gemm_nt_contiguous(act.to(BF16), self.l2, d2, layout)
        # 5. combine: the rows back to their source ranks
        out = torch.zeros(T * K, H, dtype=BF16)
        lo, hi = offsets[me], offsets[me + 1]
        mine = (rows >= lo) & (rows < hi)
        out[pairs[mine] - lo * K] = d2[mine]
        recvs, reqs, sends = [], [], []
        for s in range(R):
            if s == me:
                continue
            dst = (rows >= offsets[s]) & (rows < offsets[s + 1])
            chunk = d2[dst].contiguous()
            if chunk.numel():
                sends.append(chunk)
                reqs.append(dist.isend(chunk.view(torch.int16), dst=s, group=group))
            theirs = self._local_pairs(flat_e, s)
            theirs = theirs[(theirs // K >= lo) & (theirs // K < hi)]
            if theirs.numel():
                buf = torch.empty(theirs.numel(), H, dtype=BF16)
                reqs.append(dist.irecv(buf.view(torch.int16), src=s, group=group))
                recvs.append((theirs - lo * K, buf))
        for r in reqs:
            r.wait()
        for pos, buf in recvs:
            out[pos] = buf
        # 6. per token, float32 sum in slot order from +0
        y = torch.zeros(T, H, dtype=F32)
        o = out.view(T, K, H)
        for j in range(K):
            y += o[:, j].float()
        return y.to(BF16), M, int(torch.unique(layout).numel()) if M else 0


# ---- one rank -----------------------------------------------------------------------------------

def _barrier(group):
    import torch.distributed as dist
    dist.barrier(group=group)


def _max_over_ranks(v, group):
    import torch.distributed as dist
    t = torch.tensor([v], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


def _timed(fn, group, reps):
    times, out = [], None
    for _ in range(reps):
        _barrier(group)
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return times, out


def _rank_figures(cfg, mma, T, pairs, active, t_fused, t_unfused, diff, bitwise, lim, threads, lim_threads,
                  ranks):
    H, I = cfg['hidden'], cfg['inter']
    flops = 2.0 * pairs * H * I * 3
    wbytes = active * expert_weight_bytes(cfg, mma)
    comm = pairs * H * ((1 if mma == 'fp8xfp4' else 2) + 2)
    peak, pname = compute_peak(lim, 'bf16')
    share = min(1.0, threads / lim_threads) if lim_threads else 1.0
    t_c = flops / (peak * share * 1e9) if peak else 0.0
    dram = lim.get('dram_gbps', 0) * 1e9 / ranks
    t_m = wbytes / dram if dram else 0.0
    bound = max(t_c, t_m)
    return dict(tokens=T, pairs=pairs, active_experts=active, flops=flops, weight_bytes=wbytes, comm_bytes=comm,
                fused_s=t_fused, unfused_s=t_unfused, tflops=flops / t_fused * 1e-12,
                lim_pct=100.0 * bound / t_fused if bound else None,
                limit=(pname if t_c >= t_m else 'dram') if bound else None, lower_bound_s=bound,
                comm_gbps=comm / t_fused * 1e-9, tokens_per_s=T / t_fused, speedup=t_unfused / t_fused,
                calc_diff=diff, bitwise=bitwise)


def _rank_main(local_rank, opts):
    os.environ['MASTER_ADDR'], os.environ['MASTER_PORT'] = '127.0.0.1', str(opts['port'])
    if opts['network']:
        os.environ['DG_COMM_FORCE_NETWORK'] = '1'
    threads, R, mma, cfg = opts['threads'], opts['ranks'], opts['mma'], opts['cfg']
    torch.set_num_threads(threads)
    dg.set_num_sms(threads)
    from deep_gemm_cpu.utils.dist import init_dist
    import torch.distributed as dist
    rank, world, group = init_dist(local_rank, R)
    E, H, I, K = cfg['experts'], cfg['hidden'], cfg['inter'], cfg['topk']
    epr = E // R
    t0 = time.perf_counter()
    l1, l2 = make_weights(cfg, mma, rank, R, opts['seed'])
    if opts['transform']:
        l1, l2 = dg.transform_weights_for_mega_moe(l1, l2)
    if opts['mpi']:
        from mpi4py import MPI
        buffer_group = MPI.COMM_WORLD  # the library's MPI bootstrap: shared memory, or the network path
    else:
        buffer_group = group
    buffer = dg.get_symm_buffer_for_mega_moe(buffer_group, E, max(opts['tokens']), K, H, I, mma_type=mma)
    setup = _max_over_ranks(time.perf_counter() - t0, group)
    fused_fn = dg.fp8_fp4_mega_moe if mma == 'fp8xfp4' else dg.bf16_mega_moe
    unfused = Unfused(cfg, mma, rank, R, group, l1, l2, opts['clamp'])
    if rank == 0:
        print(f'setup {setup:.1f} s (weights of {epr} experts per rank, symmetric buffer for '
              f'{buffer.num_max_tokens_per_rank} tokens per rank)', flush=True)
        print(f'{"tokens":>7} {"rank":>4} {"pairs":>6} {"experts":>7} {"fused ms":>9} {"TFLOPS":>7} '
              f'{"limit":>5} {"%lim":>5} {"comm GB/s":>9} {"tokens/s":>9} {"unfused ms":>10} '
              f'{"fused/unf":>9} {"calc_diff":>9}', flush=True)
    results, failed = [], False
    for T in opts['tokens']:
        xq, idx, w = make_tokens(cfg, mma, rank, T, opts['seed'])

        def put():
            buffer.x[:T].copy_(xq[0])
            if mma == 'fp8xfp4':
                buffer.x_sf[:T].copy_(xq[1])
            buffer.topk_idx[:T].copy_(idx)
            buffer.topk_weights[:T].copy_(w)

        y = torch.empty(T, H, dtype=BF16)

        def fused(stats=None):
            put()
            _barrier(group)
            t = time.perf_counter()
            fused_fn(y, l1, l2, buffer, cumulative_local_expert_recv_stats=stats, activation_clamp=opts['clamp'])
            return time.perf_counter() - t

        # warm-up (with the recv stats, checked against the unfused chain's count); its path
        # report says how the tokens travelled (shared memory or the MPI network path)
        stats = torch.zeros(epr, dtype=torch.int32)
        saved_paths = dg.get_print_paths()
        dg.set_print_paths(2)
        dg.clear_path_report()
        tw = fused(stats)
        path = next((ln for ln in dg.get_path_report() if 'mega_moe' in ln), '?')
        dg.set_print_paths(saved_paths)
        if rank == 0 and T == opts['tokens'][0]:
            print(f'path (rank 0): {path.strip()}', flush=True)
        y_unf, pairs, active = unfused(xq, idx, w)
        _barrier(group)
        t = time.perf_counter()
        unfused(xq, idx, w)
        tw += time.perf_counter() - t
        tw = _max_over_ranks(tw, group)
        reps = max(3 if tw < opts['budget'] else 1, min(opts['max_reps'], int(opts['budget'] / max(tw, 1e-6))))
        if opts['reps']:
            reps = opts['reps']
        t_f = statistics.median(fused() for _ in range(reps))
        times, (y_unf, _, _) = _timed(lambda: unfused(xq, idx, w), group, reps)
        t_u = statistics.median(times)
        diff = float(dg.calc_diff(y.float(), y_unf.float()))
        bitwise = bool(torch.equal(y.view(torch.int16), y_unf.view(torch.int16)))
        stats_ok = int(stats.sum()) == pairs
        fig = _rank_figures(cfg, mma, T, pairs, active, t_f, t_u, diff, bitwise, opts['limits'], threads,
                            opts['limit_threads'], R)
        fig.update(rank=rank, reps=reps, recv_stats=stats.tolist(), recv_stats_ok=stats_ok,
                   finite=bool(torch.isfinite(y.float()).all()))
        everyone = [None] * world
        dist.all_gather_object(everyone, fig, group=group)
        if rank == 0:
            tot = _total(cfg, mma, everyone, opts)
            for f in everyone + [tot]:
                print(_row(f), flush=True)
            bad = [f for f in everyone if not (f['calc_diff'] <= MAX_DIFF and f['recv_stats_ok'] and f['finite'])]
            for f in bad:
                print(f'  rank {f["rank"]}: FUSED OUTPUT WRONG: calc_diff {f["calc_diff"]:.3e} vs the unfused chain '
                      f'(limit {MAX_DIFF}), recv stats sum {sum(f["recv_stats"])} vs {f["pairs"]} pairs, '
                      f'finite {f["finite"]}', flush=True)
            failed = failed or bool(bad)
            results.append(dict(tokens=T, ranks=everyone, all=tot))
    buffer.destroy()
    if rank == 0:
        note = ('bitwise equal to the unfused chain on every rank and token count'
                if all(f['bitwise'] for r in results for f in r['ranks']) else
                'not bitwise equal to the unfused chain everywhere (see calc_diff; the unfused SwiGLU\'s exp '
                'is torch\'s in double, the fused kernel\'s the library\'s float32 exp: they can differ in the last '
                'bit)')
        print(f'fused output: {note}', flush=True)
        with open(opts['result_file'], 'w') as f:
            json.dump(dict(setup_seconds=setup, results=results, failed=failed), f)
    _barrier(group)
    dist.destroy_process_group()


def _total(cfg, mma, figs, opts):
    t_f = max(f['fused_s'] for f in figs)
    t_u = max(f['unfused_s'] for f in figs)
    pairs = sum(f['pairs'] for f in figs)
    active = sum(f['active_experts'] for f in figs)
    tot = _rank_figures(cfg, mma, sum(f['tokens'] for f in figs), pairs, active, t_f, t_u,
                        max(f['calc_diff'] for f in figs), all(f['bitwise'] for f in figs), opts['limits'],
                        opts['limit_threads'], opts['limit_threads'], 1)
    tot['tokens'] = figs[0]['tokens']
    tot['tokens_per_s'] = sum(f['tokens'] for f in figs) / t_f
    tot['rank'] = 'all'
    return tot


def _row(f):
    lim = f'{f["lim_pct"]:5.1f}' if f['lim_pct'] is not None else '    -'
    diff = f'{f["calc_diff"]:9.1e}' + (' (bitwise)' if f['bitwise'] else '')
    return (f'{f["tokens"]:>7} {f["rank"]:>4} {f["pairs"]:>6} {f["active_experts"]:>7} {f["fused_s"] * 1e3:9.2f} '
            f'{f["tflops"]:7.4f} {f["limit"] or "-":>5} {lim} {f["comm_gbps"]:9.3f} {f["tokens_per_s"]:9.1f} '
            f'{f["unfused_s"] * 1e3:10.2f} {f["speedup"]:8.2f}x {diff}')


# ---- the launcher --------------------------------------------------------------------------------

def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def parse_args(argv):
    p = argparse.ArgumentParser(prog='python -m deep_gemm_cpu.mega_bench',
                                description='the fused Mega MoE across rank processes against the unfused chain')
    p.add_argument('--ranks', type=int, help='rank processes (expert-parallel; default 1, or with --mpi the '
                   'processes mpirun started)')
    p.add_argument('--tokens', type=int, nargs='+', help='tokens per rank (default 1 8 64 512; --full 1 8 64 2048)')
    p.add_argument('--mma', choices=('fp8xfp4', 'bf16xbf16'), default='fp8xfp4')
    p.add_argument('--full', action='store_true', help="DeepGEMM's reference configuration: 384 experts, top-6, "
                   'hidden 7168, intermediate 3072 (if the memory allows)')
    p.add_argument('--quick', action='store_true', help='tiny dimensions (a smoke test)')
    p.add_argument('--experts', type=int, help='experts in total (default 16; --full 384; a multiple of --ranks)')
    p.add_argument('--threads', type=int, help='threads per rank (default max(1, cores // ranks))')
    p.add_argument('--reps', type=int, default=0, help='timed calls per implementation after the warm-up '
                   '(default: as many as fit in a time budget, 3 to 10; prefill fewer)')
    p.add_argument('--clamp', type=float, default=CLAMP, help=f'activation_clamp (default {CLAMP}; negative: none)')
    p.add_argument('--limits', default='auto', help='machine limits: auto (dgbench if found, else a Python '
                   'estimate), dgbench, python, or a dgbench --json FILE')
    p.add_argument('--json', metavar='FILE', help='also write every figure as JSON to FILE')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--mpi', action='store_true', help='the ranks are the processes mpirun started (the buffer over '
                   'mpi4py.MPI.COMM_WORLD; --ranks must be absent or equal to their number)')
    p.add_argument('--network', action='store_true', help='with --mpi: DG_COMM_FORCE_NETWORK=1, the fused call '
                   'exchanges through MPI as across machines')
    a = p.parse_args(argv)
    if a.network and not a.mpi:
        p.error('--network needs --mpi (the network path is MPI: mpirun -n R python -m ... --mpi --network)')
    if a.full and a.quick:
        p.error('--full and --quick exclude each other')
    if a.ranks is not None and a.ranks < 1:
        p.error('--ranks must be at least 1')
    if a.tokens and min(a.tokens) < 1:
        p.error('--tokens must be >= 1')
    return a


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    t_start = time.perf_counter()
    key = 'full' if args.full else 'quick' if args.quick else 'default'
    cfg = dict(CONFIGS[key])
    if args.experts:
        cfg['experts'] = args.experts
    comm, me = None, 0
    if args.mpi:
        try:
            from mpi4py import MPI
        except ImportError:
            print('error: --mpi needs mpi4py (pip install mpi4py) and an mpirun launch', file=sys.stderr)
            return 1
        comm = MPI.COMM_WORLD
        me = comm.Get_rank()
        if args.ranks is not None and args.ranks != comm.Get_size():
            if me == 0:
                print(f'error: --ranks {args.ranks} but mpirun started {comm.Get_size()} processes', file=sys.stderr)
            return 1
        R = comm.Get_size()
    else:
        R = args.ranks or 1
    if me != 0:  # rank 0 checks, measures and prints; the others take its settings
        _idle_barrier(comm)
        opts = comm.bcast(None, root=0)
        if opts is None:
            return 1
        _run_or_abort(comm, me, opts)
        return 0 if not comm.bcast(None, root=0) else 2
    sent = []  # rank 0: whether the other ranks got their settings (then they run, or the job aborts)
    try:
        ran, code = _main_rank0(args, cfg, R, comm, t_start, sent)
    except BaseException:
        if comm is not None and not sent:  # failed before the run: release the other ranks
            _idle_barrier(comm)
            comm.bcast(None, root=0)
        raise
    if comm is not None and not ran:  # refused before the run: release the other ranks
        _idle_barrier(comm)
        comm.bcast(None, root=0)
    return code


def _run_or_abort(comm, rank, opts):
    """_rank_main under mpirun: a rank that fails mid-run ends the job (MPI_Abort), since its
    peers would otherwise wait for it in gloo collectives and the final broadcast."""
    try:
        _rank_main(rank, opts)
    except BaseException:
        import traceback
        traceback.print_exc()
        sys.stderr.flush()
        comm.Abort(1)


def _idle_barrier(comm):
    """A barrier that sleeps while it waits: MPI's blocking calls spin, and a rank spinning while
    rank 0 measures the machine's limits would halve them."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.005)


def _main_rank0(args, cfg, R, comm, t_start, sent):
    """Checks, limits and the header; then the run: spawned ranks, or (comm) this process as
    rank 0 of mpirun's. Returns (whether the ranks ran, the exit status)."""
    if cfg['experts'] % R:
        print(f'error: {cfg["experts"]} experts do not split over {R} ranks (--experts N, a multiple of --ranks)',
              file=sys.stderr)
        return False, 1
    if cfg['topk'] > cfg['experts']:
        print(f'error: top-{cfg["topk"]} needs at least {cfg["topk"]} experts', file=sys.stderr)
        return False, 1
    tokens = list(args.tokens or cfg['tokens'])
    if comm is not None:
        # mpirun binds each rank (Open MPI: to one core when R <= 2): the machine's cores, and per
        # rank what the binding leaves it
        cores = os.cpu_count() or 1
        threads = args.threads or max(1, min(_cores(), cores // R))
    else:
        cores = _cores()
        threads = args.threads or max(1, cores // R)
    if R * threads > cores:
        print(f'note: {R} ranks x {threads} threads oversubscribe the {cores} cores', flush=True)

    with_copy, without_copy = memory_plan(cfg, args.mma, R, tokens)
    avail = mem_available()
    transform = True
    if avail is not None:
        if without_copy > 0.9 * avail:
            E = cfg['experts']
            wgib = E * expert_weight_bytes(cfg, args.mma) / 2 ** 30
            print(f'error: {cfg["name"]} ({E} experts, hidden {cfg["hidden"]}, intermediate {cfg["inter"]}, '
                  f'{args.mma}) needs about {without_copy / 2 ** 30:.1f} GiB ({wgib:.1f} GiB of expert weights, '
                  f'symmetric buffers, activations, {R} processes) but MemAvailable is {avail / 2 ** 30:.1f} GiB: '
                  f'not run. Fewer experts (--experts N) or fp8xfp4 weights fit.',
                  file=sys.stderr)
            return False, 1
        transform = with_copy <= 0.9 * avail

    if comm is not None and hasattr(os, 'sched_setaffinity'):
        # the limits of the whole machine, not of the core mpirun bound this rank to (dgbench
        # inherits the widened affinity; the Python estimate runs torch on every core)
        bound, torch_threads = os.sched_getaffinity(0), torch.get_num_threads()
        os.sched_setaffinity(0, range(cores))
        torch.set_num_threads(cores)
        try:
            lim = measure_limits(args.limits, args.quick)
        finally:
            os.sched_setaffinity(0, bound)
            torch.set_num_threads(torch_threads)
        lim_threads = cores
    else:
        lim_threads = dg.get_num_sms()
        lim = measure_limits(args.limits, args.quick)
    peak, pname = compute_peak(lim, 'bf16')
    load0 = os.getloadavg()
    print(f'deep_gemm_cpu {dg.__version__} isa {dg.get_isa()} | torch {torch.__version__} | {cpu_name()} | '
          f'{cores} cores | load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}', flush=True)
    print(f'ranks {R} x {threads} threads per rank (torch.set_num_threads, set_num_sms) | mma {args.mma} | '
          f'{cfg["name"]}: hidden {cfg["hidden"]}, intermediate {cfg["inter"]}, {cfg["experts"]} experts'
          + (f' (of {cfg["real_experts"]})' if cfg['experts'] != cfg['real_experts'] else '')
          + f', top-{cfg["topk"]}, activation_clamp {args.clamp if args.clamp >= 0 else "none"} | tokens per rank '
          f'{" ".join(map(str, tokens))}', flush=True)
    print(f'limits: fp32 {lim.get("fp32_gflops", 0):.1f} GFLOPS, bf16 {lim.get("bf16_gflops", 0):.1f}, amx_bf16 '
          f'{lim.get("amx_bf16_gflops", 0):.1f}, dram {lim.get("dram_gbps", 0):.1f} GB/s, measured with '
          f'{lim_threads} threads [{lim["source"]}]; compute bound: {pname} {peak:.1f} GFLOPS (FP8 x FP4 runs on the '
          f'BF16 path), per rank x {min(1.0, threads / lim_threads):.2f}; DRAM bound per rank: 1/{R} of the '
          f'bandwidth', flush=True)
    if not transform:
        print('note: weights passed untransformed (transform_weights_for_mega_moe copies and packs them on the '
              'CPU, about 3 bytes per weight; that would not fit in memory)', flush=True)
    print('per rank: pairs = (token, slot) pairs received by its experts; TFLOPS = 2 * pairs * hidden * '
          'intermediate * 3 over the fused time; comm = pairs * hidden * '
          f'{3 if args.mma == "fp8xfp4" else 4} bytes (dispatched x + returned BF16 rows); fused/unf = unfused '
          'time over fused time', flush=True)

    if args.mpi:
        print(f'ranks started by mpirun; symmetric buffer over mpi4py.MPI.COMM_WORLD, '
              + ('DG_COMM_FORCE_NETWORK=1: the MPI network path' if args.network else
                 'the shared-memory path where the ranks share a machine'), flush=True)

    import tempfile
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as d:
        result_file = os.path.join(d, 'result.json')
        opts = dict(port=_free_port(), threads=threads, ranks=R, mma=args.mma, cfg=cfg, tokens=tokens,
                    seed=args.seed, transform=transform, clamp=args.clamp if args.clamp >= 0 else None,
                    limits=lim, limit_threads=lim_threads, reps=args.reps, max_reps=10,
                    budget=1.0 if args.quick else 4.0, result_file=result_file, mpi=args.mpi,
                    network=args.network)
        if comm is not None:
            _idle_barrier(comm)
            comm.bcast(opts, root=0)
            sent.append(True)
            _run_or_abort(comm, 0, opts)
        else:
            mp.start_processes(_rank_main, args=(opts,), nprocs=R, join=True, start_method='spawn')
        with open(result_file) as f:
            out = json.load(f)
        if comm is not None:
            comm.bcast(out['failed'], root=0)
    seconds = time.perf_counter() - t_start
    load1 = os.getloadavg()
    print(f'run took {seconds:.0f} s; load average at the end {load1[0]:.2f}', flush=True)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(dict(version=dg.__version__, isa=dg.get_isa(), torch=torch.__version__, cpu=cpu_name(),
                           cores=cores, ranks=R, threads_per_rank=threads, mma=args.mma, config=cfg,
                           tokens=tokens, clamp=opts['clamp'], transformed_weights=transform, limits=lim,
                           limit_threads=lim_threads, compute_peak=dict(name=pname, gflops=peak),
                           load_average_start=list(load0), load_average_end=list(load1), seconds=seconds,
                           **out), f, indent=1)
    if out['failed']:
        print(f'error: the fused output differs from the unfused chain (calc_diff > {MAX_DIFF}) or its recv '
              f'stats are wrong', file=sys.stderr)
        return True, 2
    return True, 0


if __name__ == '__main__':
    sys.exit(main())
